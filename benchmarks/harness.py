"""The benchmark harness: one command prints a table and writes benchmarks/results/harness.json.

    python benchmarks/harness.py --corpus ../shared/wt2-mini   # the measurements (several minutes on 2 cores)
    python benchmarks/harness.py --smoke                        # seconds: every code path once, tiny sizes (CI)

--corpus is a folder in WikiText raw format (wiki.{train,valid,test}.raw): the data-stage text is built from its
train file, and preflight runs on a scratch project made from it (without it, the tests' synthetic fixture).

Timings on shared machines are noisy: every figure is a median of several rounds, and variants that are
compared are measured side by side (interleaved) in the same run, so the ratios are what to read.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench_common import (  # (bench_common also puts the repo on sys.path)
    compose_project,
    copy_into_fresh_repo,
    flops_per_token,
    machine_kind,
    machine_label,
    model_preset,
    output_path,
    prepare_project,
    synthetic_corpus,
    write_result,
)
from minigpt.core.config import CleanConfig
from minigpt.data.clean import clean_splits
from minigpt.data.tokenizer import CharTokenizer
from minigpt.evaluate.scoring import score_split
from minigpt.model import gpt as model_module
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.suite import run_preflight
from minigpt.train import train_step
from minigpt.train.loop import train
from minigpt.train.optim import build_param_groups


def median_time(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# ------------------------------------------------------------------------------------------ 1. the peak

def matmul_seconds(m: int, k: int, n: int, dtype: torch.dtype, rounds: int) -> float:
    """Median time of one [m, k] @ [k, n] product on random data (after one untimed warm-up)."""
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    return median_time(lambda: a @ b, rounds)


def matmul_peak(rounds: int, shapes: list[tuple[int, int, int]]) -> dict:
    """FLOP/s of plain matrix products at the model's shapes, fp32 and bf16, interleaved."""
    out = {}
    for m, k, n in shapes:
        out[f"{m}x{k}x{n}"] = {str(dtype).split(".")[-1]: 2 * m * k * n / matmul_seconds(m, k, n, dtype, rounds)
                               for dtype in (torch.float32, torch.bfloat16)}
    return out


# --------------------------------------------------------------------------------------- 2. training speed

def manual_causal_attention(q, k, v, dropout_p):
    """The debugging guide's attention: explicit scores, a lower-triangular mask, softmax, weighted sum."""
    t = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) / (q.size(-1) ** 0.5)
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return F.dropout(weights, dropout_p) @ v


# the project's own training path in each precision (what MFU and the other ratios are quoted against)
PROJECT_VARIANT = {"fp32": "fp32 (SDPA, foreach AdamW)", "bf16": "bf16 autocast"}


def project_rate(training: dict, precision: str) -> float:
    return next(r["tokens_per_sec"] for r in training["rows"] if r["variant"] == PROJECT_VARIANT[precision])


class Variant:
    def __init__(self, name, config, batch, precision="fp32", baseline=False, compiled=False):
        self.name, self.precision, self.baseline = name, precision, baseline
        torch.manual_seed(0)
        self.model = MiniGPT(config).train()
        groups = build_param_groups(self.model, 0.1)
        # the baseline: a per-parameter (unfused, no foreach) AdamW loop
        self.optimizer = torch.optim.AdamW(groups, lr=1e-3, foreach=False if baseline else None)
        self.run = torch.compile(self.model) if compiled else self.model
        self.x = torch.randint(0, config.vocab_size, (batch, config.block_size))
        self.y = torch.randint(0, config.vocab_size, (batch, config.block_size))

    def steps(self, count: int) -> None:
        real = model_module.causal_attention
        if self.baseline:
            model_module.causal_attention = manual_causal_attention
        try:
            for _ in range(count):  # the project's training step (clipped at 1.0), with this variant's parts
                train_step.training_step(self.run, self.optimizer, self.x, self.y, 1e-3, self.precision, 1.0,
                                         self.model.parameters())
        finally:
            model_module.causal_attention = real


def training_speed(preset: str, batch: int, vocab: int, steps: int, rounds: int, compile_too: bool,
                   peaks: dict) -> dict:
    config = model_preset(preset, vocab)
    variants = [Variant("baseline (manual attention, unfused AdamW, fp32)", config, batch, baseline=True),
                Variant(PROJECT_VARIANT["fp32"], config, batch),
                Variant(PROJECT_VARIANT["bf16"], config, batch, "bf16")]
    if config.dropout:
        # dropout's random masks, and attention-weight dropout forcing SDPA off its fused kernel, cost time
        variants.append(Variant("bf16 autocast, dropout 0 (not the preset)",
                                config.model_copy(update={"dropout": 0.0}), batch, "bf16"))
    if compile_too:
        variants.append(Variant("bf16 autocast + torch.compile", config, batch, "bf16", compiled=True))
    for v in variants:
        v.steps(2)  # warm-up (and compilation)
    samples = {v.name: [] for v in variants}
    for _ in range(rounds):  # interleaved: noise hits every variant alike
        for v in variants:
            samples[v.name].append(batch * config.block_size * steps / median_time(lambda: v.steps(steps), 1))
    params = variants[0].model.num_parameters()
    fpt = flops_per_token(config, params)
    rows = []
    base = statistics.median(samples[variants[0].name])
    for v in variants:
        rate = statistics.median(samples[v.name])
        rows.append({"variant": v.name, "tokens_per_sec": rate, "vs_baseline": rate / base,
                     "mfu": rate * fpt / peaks[v.precision], "precision": v.precision})
    return {"preset": preset, "parameters": params, "batch": batch, "block_size": config.block_size,
            "flops_per_token": fpt, "rows": rows}


def step_gemms(config, batch: int) -> Counter:
    """{(m, k, n): count}: the matrix products of one training step (forward and backward) of MiniGPT."""
    n_tok, width, vocab = batch * config.block_size, config.embedding_dim, config.vocab_size
    hidden = config.expansion_factor * width
    heads, t, d = config.num_heads, config.block_size, config.embedding_dim // config.num_heads
    gemms = Counter()
    linears = [(width, 3 * width), (width, width), (width, hidden),
               (hidden, width)] * config.num_layers + [(width, vocab)]
    for fan_in, fan_out in linears:
        gemms.update([(n_tok, fan_in, fan_out),   # forward
                      (n_tok, fan_out, fan_in),   # gradient of the input
                      (fan_in, n_tok, fan_out)])  # gradient of the weight
    # attention per (sequence, head): scores q k^T and the weighted sum, each with two backward products
    per_step = 3 * batch * heads * config.num_layers
    gemms[(t, d, t)] += per_step
    gemms[(t, t, d)] += per_step
    return gemms


def gemm_bound(preset: str, batch: int, vocab: int, rounds: int, training: dict, peaks: dict) -> dict:
    """The step's matrix products alone, timed at their real shapes in each precision: the time a step would take
    if every other op (norms, GELU, softmax, dropout, casts, AdamW, autograd) were free, and the MFU that gives."""
    config = model_preset(preset, vocab)
    rows = []
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        total_s, flops = 0.0, 0.0
        for (m, k, n), count in step_gemms(config, batch).items():  # each distinct shape timed once
            total_s += count * matmul_seconds(m, k, n, dtype, rounds)
            flops += count * 2 * m * k * n
        step_s = batch * config.block_size / project_rate(training, precision)
        rows.append({"precision": precision, "gemm_seconds": total_s, "step_seconds": step_s,
                     "gemm_share": total_s / step_s,
                     "gemm_flops_per_sec": flops / total_s,
                     "mfu_if_only_gemms":
                         training["flops_per_token"] * batch * config.block_size / total_s / peaks[precision]})
    return {"preset": preset, "batch": batch, "rows": rows}


# ---------------------------------------------------------------------------------------- 4. data stages

def data_stages(text: str, rounds: int) -> dict:
    clean_cfg = CleanConfig(unicode_form="NFC", min_char_count=3, placeholder="\ufffd", detokenize_markup=False)
    raw = {"train": text, "val": text[: len(text) // 10], "test": text[-len(text) // 10:]}
    cleaned = {}

    def run_clean():
        cleaned.update(clean_splits(raw, clean_cfg)[0])

    clean_s = median_time(run_clean, rounds)
    tokenizer_s = median_time(lambda: CharTokenizer.from_text(cleaned["train"], "\ufffd"), rounds)
    tok = CharTokenizer.from_text(cleaned["train"], "\ufffd")
    encode_s = median_time(lambda: tok.encode(cleaned["train"]), rounds)
    stoi = {ch: i for i, ch in enumerate(tok.chars)}
    sample = cleaned["train"][: max(1, len(cleaned["train"]) // 10)]
    scale = len(cleaned["train"]) / len(sample)

    def append_loop():  # the bare per-character loop: a Python list of IDs, not yet an array
        ids = []
        for ch in sample:
            ids.append(stoi[ch])
        return ids

    # the guide's way: a list comprehension turned into an array the model can index
    naive_s = median_time(lambda: np.array([stoi[ch] for ch in sample], dtype=np.int64), rounds) * scale
    loop_s = median_time(append_loop, rounds) * scale
    return {"characters": len(text), "clean_s": clean_s, "tokenizer_s": tokenizer_s, "encode_s": encode_s,
            "naive_encode_s": naive_s, "encode_speedup_vs_naive": naive_s / encode_s,
            "append_loop_s": loop_s, "encode_speedup_vs_append_loop": loop_s / encode_s,
            "total_s": clean_s + tokenizer_s + encode_s}


def data_stage_text(train_file: Path, target: int) -> str:
    base = train_file.read_text(encoding="utf-8")
    return (base * (target // len(base) + 1))[:target]


def _data_stages_once(train_file: Path, target: int) -> None:
    data_stages(data_stage_text(train_file, target), 1)


# -------------------------------------------------------------------------------------------- memory

def high_water_mb() -> float:
    """This process's peak resident memory. Linux: VmHWM, which belongs to the current address space (ru_maxrss
    would carry the parent's peak over fork + exec); elsewhere ru_maxrss."""
    try:
        status = Path("/proc/self/status").read_text()
        return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1024 / 1024


def _report_peak(queue, target, args) -> None:
    after_imports = high_water_mb()
    target(*args)
    queue.put({"after_imports_mb": after_imports, "peak_rss_mb": high_water_mb()})


def peak_rss(target, *args) -> dict:
    """Peak resident memory of target(*args) run alone in a fresh (spawned) process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_report_peak, args=(queue, target, args))
    child.start()
    result = queue.get()
    child.join()
    return result


def _train_steps(params, work: Path) -> None:
    train(params, work, require_gate=False, out=lambda _msg: None)


def training_memory(work: Path, corpus: Path, base: list[str], step_counts: list[int]) -> list[dict]:
    """Peak RSS of the real training loop for growing run lengths: bounded memory reads as a flat column."""
    rows = []
    for steps in step_counts:
        params = compose_project(work, corpus, [*base, f"train.max_steps={steps}", f"train.warmup_steps={steps // 10}",
                                                f"train.eval_every={max(1, steps // 2)}",
                                                "train.sample_length=0"])
        rows.append({"steps": steps, **peak_rss(_train_steps, params, work)})
    return rows


# ------------------------------------------------------------------------------------ no-op dvc repro

def noop_repro(scratch: Path, corpus: Path, rounds: int) -> dict:
    """A copy of the working tree's tracked files as a fresh git repo; the whole DAG at debug scale once,
    then `dvc repro` with nothing changed, timed (DVC hashes deps and params and finds nothing to run)."""
    repo = scratch / "repo"
    git = copy_into_fresh_repo(repo, "harness")
    git("add", "-A")
    git("commit", "-qm", "snapshot")
    compose_project(repo, corpus, ["experiment=debug"])
    dvc = [sys.executable, "-m", "dvc", "repro", "-q"]
    # the stage commands say `python`: this interpreter's environment first on PATH, as `make` does
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    first = subprocess.run(dvc, cwd=repo, capture_output=True, text=True, env=env)
    if first.returncode:
        raise SystemExit(f"dvc repro in {repo} failed:\n{first.stdout}{first.stderr}")
    seconds = median_time(lambda: subprocess.run(dvc, cwd=repo, check=True, capture_output=True, env=env), rounds)
    return {"stages": 8, "noop_repro_s": seconds}


# ---------------------------------------------------------------------------- preflight vs a production run

def preflight_share(work: Path, corpus: Path, base: list[str], production_tokens_per_sec: float) -> dict:
    params = compose_project(work, corpus, base)
    report = run_preflight(params, work)
    run_s = params.train.max_steps * params.train.batch_size * params.model.block_size / production_tokens_per_sec
    return {"passed": report["passed"], "preflight_s": report["seconds"]["total"],
            "without_overfit_s": report["seconds"]["without_overfit"], "production_run_s": run_s,
            "share_without_overfit": report["seconds"]["without_overfit"] / run_s}


# ---------------------------------------------------------------------------------------------- 5. eval

def evaluation_speed(preset: str, vocab: int, tokens: int, rounds: int, batch: int, training: dict) -> dict:
    """Full-split scoring tokens/s in each precision, against training tokens/s in the same precision."""
    config = model_preset(preset, vocab)
    torch.manual_seed(0)
    model = MiniGPT(config)
    ids = np.random.default_rng(0).integers(0, vocab, tokens)
    stride = config.block_size // 2
    rows = []
    for precision in ("fp32", "bf16"):
        seconds = median_time(lambda: score_split(model, ids, stride, batch, torch.device("cpu"), precision), rounds)
        rows.append({"precision": precision, "tokens_per_sec": tokens / seconds,
                     "vs_training": tokens / seconds / project_rate(training, precision)})
    return {"preset": preset, "tokens": tokens, "stride": stride, "batch": batch, "rows": rows}


def generate_recompute(model, ids, new_tokens: int, settings, generator):
    """The way before the KV cache (and the guide's): a full forward pass over the cropped window per token."""
    from minigpt.model.sampling import next_token_logits

    block = model.config.block_size
    with torch.no_grad():
        for _ in range(new_tokens):
            context = ids[:, -block:]
            logits, _ = model(context)
            scores = next_token_logits(logits[:, -1, :], context, settings)
            ids = torch.cat([ids, torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)], dim=1)
    return ids


def generation_speed(preset: str, vocab: int, new_tokens: int, rounds: int) -> dict:
    """Sampling tokens/s of one prompt (batch 1, fp32, the generate stage's settings), recomputing the window per
    token against the KV cache, interleaved round by round."""
    from minigpt.model.sampling import SamplingSettings

    config = model_preset(preset, vocab)
    torch.manual_seed(0)
    model = MiniGPT(config).eval()
    prompt = torch.randint(0, vocab, (1, 60))
    settings = SamplingSettings(0.8, 40, 0.95, 1.0)
    ways = {"recompute the window per token (before)": lambda: generate_recompute(
                model, prompt, new_tokens, settings, torch.Generator().manual_seed(1)),
            "KV cache": lambda: list(model.generate_stream(prompt, new_tokens, settings,
                                                        torch.Generator().manual_seed(1)))}
    times = {name: [] for name in ways}
    for _ in range(rounds):
        for name, run in ways.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rows = [{"way": name, "tokens_per_sec": new_tokens / statistics.median(t)} for name, t in times.items()]
    rows[1]["vs_before"] = rows[1]["tokens_per_sec"] / rows[0]["tokens_per_sec"]
    return {"preset": preset, "block_size": config.block_size, "prompt": 60, "new_tokens": new_tokens, "rows": rows}


# ---------------------------------------------------------------------------------------------- table

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one round: checks the code paths in seconds")
    parser.add_argument("--corpus", type=Path,
                        help="a folder with wiki.{train,valid,test}.raw (else the synthetic fixture)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile on CPU)")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/harness/<machine class>.json")
    args = parser.parse_args()
    rounds = 1 if args.smoke else 5
    vocab = 119  # wt2-mini's vocabulary
    result = {"machine": {**machine_label(), "python": platform.python_version(),
                          "torch": torch.__version__, "threads": torch.get_num_threads()},
              "smoke": args.smoke}

    shapes = [(256, 64, 64)] if args.smoke else [(4096, 256, 1024), (4096, 1024, 256), (2048, 2048, 2048)]
    result["matmul"] = matmul_peak(rounds, shapes)
    peaks = {dt: max(r[dt] for r in result["matmul"].values()) for dt in ("float32", "bfloat16")}
    peaks = {"fp32": peaks["float32"], "bf16": peaks["bfloat16"]}
    result["peak_flops"] = peaks

    if args.smoke:
        result["training"] = [training_speed("debug", 2, vocab, 1, 1, False, peaks)]
    else:
        result["training"] = [training_speed("debug", 8, vocab, 20, rounds, args.compile, peaks),
                              training_speed("production", 32, vocab, 3, rounds, args.compile, peaks)]

    result["gemm_bound"] = gemm_bound(result["training"][-1]["preset"], result["training"][-1]["batch"], vocab,
                                      rounds, result["training"][-1], peaks)
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-harness-"))
    corpus = args.corpus or synthetic_corpus(scratch / "corpus")
    target = 20_000 if args.smoke else 13_500_000  # WikiText-2's size
    train_file = corpus / "wiki.train.raw"
    result["data_stages"] = data_stages(data_stage_text(train_file, target), 1 if args.smoke else 3)
    result["data_stages"]["memory"] = peak_rss(_data_stages_once, train_file, target)

    big = result["training"][-1]
    result["evaluation"] = evaluation_speed(big["preset"], vocab, 2_000 if args.smoke else 60_000, rounds,
                                            64, big)  # evaluate.batch_size
    result["generation"] = generation_speed(big["preset"], vocab, 20 if args.smoke else 300, rounds)

    work = scratch / "project"
    prepare_project(work, corpus)
    base = ["experiment=debug"] if args.smoke else []  # the production defaults
    result["preflight"] = preflight_share(work, corpus, base, project_rate(big, "bf16"))
    result["training_memory"] = training_memory(work, corpus, base, [2, 4] if args.smoke else [20, 80])
    result["dvc"] = noop_repro(scratch, corpus, 1 if args.smoke else 3)
    shutil.rmtree(scratch, ignore_errors=True)

    kind = machine_kind(result["machine"])  # on every row: figures of two machines are never mixed
    for rows in [t["rows"] for t in result["training"]] + [result["gemm_bound"]["rows"], result["evaluation"]["rows"],
                                                          result["generation"]["rows"]]:
        for row in rows:
            row["machine"] = kind
    args.out = output_path(args.out, "harness", args.smoke)
    write_result(args.out, result)
    print_table(result)
    print(f"\nwrote {args.out}")


def print_table(r: dict) -> None:
    m = r["machine"]
    print(f"machine: {machine_kind(m)}, {m['cores']} cores, torch {m['torch']}, {m['torch_threads']} threads"
          f"{'  (SMOKE: not timings)' if r['smoke'] else ''}")
    print(f"peak matmul: fp32 {r['peak_flops']['fp32'] / 1e9:,.0f} GFLOP/s, bf16 {r['peak_flops']['bf16'] / 1e9:,.0f} "
          "GFLOP/s")
    for t in r["training"]:
        print(f"\ntraining, {t['preset']} ({t['parameters']:,} parameters, batch {t['batch']} x {t['block_size']})")
        print(f"  {'variant':<50} {'tokens/s':>10} {'x base':>7} {'MFU':>6}")
        for row in t["rows"]:
            print(f"  {row['variant']:<50} {row['tokens_per_sec']:>10,.0f} {row['vs_baseline']:>7.2f} "
                  f"{row['mfu']:>6.1%}")
    for g in r["gemm_bound"]["rows"]:
        print(f"  {g['precision']}: the step's matrix products alone take {g['gemm_seconds'] * 1e3:.0f} ms of its "
              f"{g['step_seconds'] * 1e3:.0f} ms ({g['gemm_share']:.0%}), at {g['gemm_flops_per_sec'] / 1e9:,.0f} "
              f"GFLOP/s: MFU {g['mfu_if_only_gemms']:.0%} if every other op were free")
    d = r["data_stages"]
    print(f"\ndata stages on {d['characters']:,} characters: clean {d['clean_s']:.2f}s, tokenizer "
          f"{d['tokenizer_s']:.2f}s, encode {d['encode_s']:.3f}s ({d['encode_speedup_vs_naive']:.0f}x a per-character "
          f"list comprehension to an array, {d['naive_encode_s']:.2f}s; {d['encode_speedup_vs_append_loop']:.0f}x a "
          f"bare append loop, {d['append_loop_s']:.2f}s); peak RSS {d['memory']['peak_rss_mb']:,.0f} MB "
          f"({d['memory']['after_imports_mb']:,.0f} MB after imports)")
    e = r["evaluation"]
    for row in e["rows"]:
        print(f"evaluation ({e['preset']}, stride {e['stride']}, batch {e['batch']}, {row['precision']}): "
              f"{row['tokens_per_sec']:,.0f} tokens/s = {row['vs_training']:.1f}x {row['precision']} training tokens/s")
    g = r["generation"]
    for row in g["rows"]:
        print(f"generation ({g['preset']}, block {g['block_size']}, {g['new_tokens']} new tokens, batch 1, fp32), "
              f"{row['way']}: {row['tokens_per_sec']:,.0f} tokens/s"
              + (f" = {row['vs_before']:.1f}x" if "vs_before" in row else ""))
    p = r["preflight"]
    print(f"preflight: {p['preflight_s']:.1f}s of checks, {p['without_overfit_s']:.1f}s without the overfit check "
          f"= {p['share_without_overfit']:.2%} of a production "
          f"run ({p['production_run_s'] / 60:.0f} min at the bf16 rate){'' if p['passed'] else '  (FAILED)'}")
    print(f"no-op `dvc repro` ({r['dvc']['stages']} stages, all up to date): {r['dvc']['noop_repro_s']:.2f}s")
    for m in r["training_memory"]:
        print(f"training memory, {m['steps']} steps: peak RSS {m['peak_rss_mb']:,.0f} MB "
              f"({m['after_imports_mb']:,.0f} MB after imports)")


if __name__ == "__main__":
    main()
