"""What the benchmark scripts share: model presets and budget shapes from conf/, the FLOP count used for MFU, the
machine's label and class, results files with their manifest, scratch projects on a corpus, and the timing of
training steps side by side in interleaved rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minigpt.core.compose import compose_params  # noqa: E402
from minigpt.core.config import ModelConfig, load_params  # noqa: E402
from minigpt.model.gpt import MiniGPTConfig  # noqa: E402


def model_preset(name: str, vocab: int) -> MiniGPTConfig:
    """conf/model/<name>.yaml as a MiniGPTConfig for a vocabulary of `vocab` characters."""
    values = yaml.safe_load((ROOT / "conf" / "model" / f"{name}.yaml").read_text())
    return MiniGPTConfig.from_params(ModelConfig(**values), vocab)


def flops_per_token(config: MiniGPTConfig, params: int) -> float:
    """Training FLOPs per token: 6 x parameters, plus attention scores and values (12 x layers x T x width)."""
    return 6 * params + 12 * config.num_layers * config.block_size * config.embedding_dim


def machine_label() -> dict:
    """The CPU every figure is measured on: model name, family/model numbers and the ISA flags that decide bf16
    speed (Linux /proc/cpuinfo), so figures of different machines are never mixed."""
    import platform

    import torch

    from minigpt.core.machine import cpu_info, isa

    info = cpu_info()
    return {"cpu": info.name, "cpu_family_model": info.family_model, "isa": isa(info), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform()}


def machine_kind(label: dict) -> str:
    """A short name for the machine's kind: 'AMX' or 'AVX512_BF16, no AMX' or 'no bf16 instructions'."""
    if "amx_bf16" in label["isa"]:
        return f"{label['cpu']} (AMX)"
    if "avx512_bf16" in label["isa"]:
        return f"{label['cpu']} (AVX512_BF16, no AMX)"
    return f"{label['cpu']} (no bf16 instructions)"


def machine_class(label: dict) -> str:
    """The class a result file is kept per: the ISA kind that decides bf16 speed, times the cores
    (`amx-2c`, `avx512_bf16-2c`, `avx2-2c`; a GPU result is named by its device)."""
    if label.get("device"):
        return str(label["device"]).lower().replace(" ", "-")
    isa = label.get("isa") or []
    kind = "amx" if "amx_bf16" in isa else "avx512_bf16" if "avx512_bf16" in isa else "avx2"
    return f"{kind}-{label.get('cores')}c"


def manifest(label: dict) -> dict:
    """Where a result came from: the command, the commit (with `-dirty` when the work tree had changes), the UTC
    date and the machine label."""
    import datetime
    import shlex
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "-dirty"
    script = Path(sys.argv[0]).resolve()
    where = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    command = shlex.join(["python", str(where), *sys.argv[1:]])
    return {"command": command, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "machine": label}


def results_path(benchmark: str, label: dict | None = None, variant: str = "") -> Path:
    """benchmarks/results/<benchmark>/<machine class>[-<variant>].json: a benchmark's current result on this machine
    (a variant, e.g. bf16 steps, kept beside the default one)."""
    suffix = f"-{variant}" if variant else ""
    return ROOT / "benchmarks" / "results" / benchmark / f"{machine_class(label or machine_label())}{suffix}.json"


def output_path(out: Path | None, benchmark: str, smoke: bool, variant: str = "") -> Path:
    """--out when given; otherwise the benchmark's results file for this machine (results_path, with its variant),
    or, for a --smoke run (code paths, not figures), a scratch file that never replaces a result."""
    if out is not None:
        return out
    if smoke:
        return Path(tempfile.mkdtemp(prefix=f"minigpt-{benchmark}-smoke-")) / f"{benchmark}.json"
    return results_path(benchmark, variant=variant)


def write_result(path: Path, result: dict) -> None:
    """A result file with its manifest first, written whole (a temporary file in the same folder, then renamed)."""

    from minigpt.core.io_utils import atomic_write_text

    label = result.get("machine") or machine_label()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"manifest": manifest(label), **result}, indent=2) + "\n")


def copy_into_fresh_repo(repo: Path, user: str):
    """The working tree's files (tracked, and untracked ones git does not ignore) copied into a new git repo at
    `repo`; returns a `git(*args)` runner for it."""
    import shutil
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)

    def git(*args: str):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.name", f"minigpt {user}")
    git("config", "user.email", f"{user}@minigpt.invalid")
    return git


def dvc_env() -> dict:
    """The environment for DVC in a scratch project: this venv's python first on PATH (DVC's `python stages/...`
    commands), no analytics, and no fixed MINIGPT_THREADS, so each stage takes its share of the cores."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "DVC_NO_ANALYTICS": "1"}
    env.pop("MINIGPT_THREADS", None)
    return env


DATA_STAGES = ("fetch", "clean", "tokenizer", "encode", "soft_targets", "baselines")


def compose_project(work: Path, corpus: Path, overrides: list[str]):
    """params.yaml in `work` for the local corpus folder plus Hydra overrides; returns the validated Params."""
    from minigpt.core.compose import compose_params
    from minigpt.core.config import load_params

    compose_params(work / "params.yaml", ROOT / "conf", ["data=local", f"data.path={corpus.resolve()}", *overrides])
    return load_params(work / "params.yaml")


def prepare_project(work: Path, corpus: Path) -> None:
    """A scratch project in `work`: the real data stages (fetch -> encode, baselines) run on a local WikiText-format
    folder."""
    import subprocess

    work.mkdir(parents=True, exist_ok=True)
    compose_project(work, corpus, [])
    for stage in DATA_STAGES:
        subprocess.run([sys.executable, str(ROOT / "stages" / f"{stage}.py")], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)


def refresh_tokens(work: Path) -> None:
    """The tokenizer, encode and soft_targets stages again, for the params now in `work` (a run with another
    tokenizer, or other soft targets)."""
    import subprocess

    for stage in ("tokenizer", "encode", "soft_targets"):
        subprocess.run([sys.executable, str(ROOT / "stages" / f"{stage}.py")], cwd=work, check=True,
                       stdout=subprocess.DEVNULL)


def clear_checkpoints(work: Path) -> None:
    """Remove the scratch project's checkpoints, so the next run starts fresh instead of resuming."""
    from minigpt.core.paths import BEST_CHECKPOINT, LATEST_CHECKPOINT

    for path in (LATEST_CHECKPOINT, BEST_CHECKPOINT):
        (work / path).unlink(missing_ok=True)


def synthetic_corpus(folder: Path) -> Path:
    """The tests' WikiText-shaped fixture written as wiki.{train,valid,test}.raw (used when no corpus is given)."""
    from minigpt.testing.wikitext_fixture import make_texts

    folder.mkdir(parents=True, exist_ok=True)
    for name, text in make_texts().items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


VOCAB = 119  # wt2-mini's vocabulary
# --smoke: the small budget shape made tiny (code paths in seconds, not timings)
SMOKE_SHAPE = ["model.embedding_dim=32", "model.num_layers=1", "model.block_size=16"]


def shape_params(shape: str, overrides: list[str], scratch: Path):
    """A budget shape forced (conf/shape/), without this machine's stored choice: the benchmark times both."""
    compose_params(scratch / "params.yaml", ROOT / "conf", ["experiment=budget-72s", "machine=none", f"shape={shape}",
                                                           "train.precision=fp32", *overrides])
    return load_params(scratch / "params.yaml")


def timing_parser(doc: str, steps: int, rounds: int) -> argparse.ArgumentParser:
    """The timing benchmarks' shared options: --steps per round, --rounds, --smoke, --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path)
    return parser


def random_batch(params) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed batch of the shape's size (inputs, targets), the same for every variant timed."""
    gen = torch.Generator().manual_seed(0)
    size = (params.train.batch_size, params.model.block_size)
    return torch.randint(0, VOCAB, size, generator=gen), torch.randint(0, VOCAB, size, generator=gen)


def interleaved_rates(runners: dict, inputs: torch.Tensor, targets: torch.Tensor, steps: int,
                      rounds: int) -> dict[str, list[float]]:
    """tokens/s of each runner (a step function of inputs, targets), `steps` steps per round, the runners taking
    turns for `rounds` rounds (so a machine that slows down slows them all)."""
    rates = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            started = time.perf_counter()
            for _ in range(steps):
                runner(inputs, targets)
            rates[name].append(steps * inputs.numel() / (time.perf_counter() - started))
    return rates


def shape_rates(shape: str, params, rates: dict[str, list[float]], before: str) -> dict:
    """A shape's medians and their ratios to the `before` variant, with the rounds."""
    base = statistics.median(rates[before])
    return {"shape": shape, "optimizer": params.train.optimizer, "model": params.model.model_dump(),
            "batch": [params.train.batch_size, params.model.block_size],
            "tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
            "ratio_to_before": {m: statistics.median(r) / base for m, r in rates.items()}, "rounds": rates}


def run_shapes(measure, args, benchmark: str, variant: str = "") -> None:
    """Both budget shapes through measure(shape, overrides, steps, rounds, scratch) (--smoke: the small one, made
    tiny, one round of one step), printed, and written with the machine's label (output_path)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"minigpt-{benchmark}-"))
    overrides, shapes = [], ("small", "production")
    if args.smoke:
        overrides = SMOKE_SHAPE
        args.steps, args.rounds, shapes = 1, 1, ("small",)
    results = [measure(shape, overrides, args.steps, args.rounds, scratch) for shape in shapes]
    for result in results:
        for name, rate in result["tokens_per_s"].items():
            print(f"{result['shape']:<11} {name:<46} {rate:>8,.0f} tokens/s ({result['ratio_to_before'][name]:.2f}x)")
    out = output_path(args.out, benchmark, args.smoke, variant)
    write_result(out, {"machine": machine_label(), "shapes": results})
    print(f"wrote {out}")

# a budget-72s run made tiny: 3 s of a one-layer model, on the fixture, in seconds (the benchmarks' --smoke runs)
BUDGET_SMOKE = ["machine=none", "shape=small", "train.precision=fp32", "train.max_seconds=3", "model.embedding_dim=32",
                "model.num_heads=2", "model.num_layers=1", "model.block_size=32", "train.warmup_steps=10",
                "train.lr=0.01"]


def trained_smoke_project(prefix: str) -> Path:
    """A scratch project on the synthetic fixture holding a checkpoint of a 3-second budget-72s run (BUDGET_SMOKE),
    through the real gate: what the benchmarks that read a trained checkpoint use for --smoke."""
    from minigpt.preflight.suite import run_preflight
    from minigpt.train.loop import train

    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    corpus, work = synthetic_corpus(scratch / "corpus"), scratch / "project"
    prepare_project(work, corpus)
    params = compose_project(work, corpus, ["experiment=budget-72s", *BUDGET_SMOKE, "train.sample_length=0"])
    refresh_tokens(work)  # the budget preset's soft targets
    report = run_preflight(params, work)
    if not report["passed"]:
        raise SystemExit(f"the smoke run's preflight failed: {report['failed']}")
    train(params, work, out=lambda _message: None)
    return work
