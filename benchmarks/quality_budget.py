"""Quality per wall clock: val bits per character after a fixed training budget, through the real pipeline code.

    python benchmarks/quality_budget.py --corpus ../shared/wt2-mini                 # references + 72 s preset
    python benchmarks/quality_budget.py --corpus ../shared/wt2-mini --long          # + the 15-minute preset
    python benchmarks/quality_budget.py --corpus DIR --run name 'model.num_layers=6' 'train.lr=2e-3' ...
    python benchmarks/quality_budget.py --corpus DIR --tokenizers [--long]          # char vs BPE, 72 s [+ 15 min]
    python benchmarks/quality_budget.py --smoke        # seconds, on the tests' synthetic fixture (CI runs this)

The presets run with this machine's stored choice of shape and precision (conf/machine/: run `make machine`
first). Each run: the data stages once (cached in the work folder), then per run preflight (the real gate, timed),
train (`train.max_seconds` ends it), and full-split evaluation of the best checkpoint (every val/test character
scored once with >= block_size/2 characters of context). The reference is nanoGPT's README CPU recipe
(4 layers, 4 heads, width 128, block 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4, fp32) run by this project's
loop, so the comparison is side by side on the same machine and data; the same recipe is also run for each
preset's wall clock (its LR decaying over the clock), the reference a budget preset has to beat on this machine.
Results go to benchmarks/results/quality_budget/<machine class>.json, with a manifest (command, commit, date,
machine).
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_common import (
    BUDGET_SMOKE,
    ROOT,
    clear_checkpoints,
    compose_project,
    machine_kind,
    machine_label,
    manifest,
    prepare_project,
    refresh_tokens,
    results_path,
    synthetic_corpus,
    write_result,
)
from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.data.encode import load_ids
from minigpt.data.soft_target_files import load_heldout_priors
from minigpt.evaluate.checkpoint_eval import evaluate_checkpoint
from minigpt.evaluate.intervals import welch_interval
from minigpt.model.batch_loss import evaluate_model
from minigpt.model.checkpoint import load_checkpoint, model_from_checkpoint
from minigpt.preflight.suite import run_preflight
from minigpt.train.loop import train

# nanoGPT README, "I only have a macbook": train_shakespeare_char.py with these CPU overrides (dropout 0)
REFERENCE = ["model.num_layers=4", "model.num_heads=4", "model.embedding_dim=128", "model.block_size=64",
             "model.dropout=0.0", "train.batch_size=12", "train.max_steps=2000", "train.warmup_steps=100",
             "train.lr=1e-3", "train.min_lr=1e-4", "train.betas=[0.9,0.99]", "train.weight_decay=0.1",
             "train.grad_clip=1.0", "train.precision=fp32", "train.eval_every=250", "train.eval_batches=20"]
# the same recipe for a wall clock instead of 2000 steps: the LR decays over the budget, as the presets' does
CLOCKED = ["train.max_steps=1000000"]
# the budget shape the rule did not pick on the calibration machines, forced (conf/shape/; the other side of the
# rule's calibration, docs/data-and-config.md, "Budget shapes")
ONLY_PRODUCTION = ["shape=production"]
ONLY_SMALL = ["shape=small"]
# the presets' rows also report dynamic evaluation and the model mixed with the 9-gram (separate columns, never the
# val bpc)
SEPARATE_FIGURES = ["evaluate.dynamic=true", "evaluate.mixture_order=9"]
RUNS = {
    "nanoGPT CPU recipe (reference)": REFERENCE,
    "nanoGPT recipe, 72 s (reference)": [*REFERENCE, *CLOCKED, "train.max_seconds=72"],
    "budget-72s preset": ["experiment=budget-72s", *SEPARATE_FIGURES],
    "production shape, 72 s (forced)": ["experiment=budget-72s", *ONLY_PRODUCTION],
}
LONG_RUNS = {"nanoGPT recipe, 15 min (reference)": [*REFERENCE, *CLOCKED, "train.max_seconds=900"],
             "budget-15m preset": ["experiment=budget-15m", *SEPARATE_FIGURES],
             "small shape, 15 min (forced)": ["experiment=budget-15m", *ONLY_SMALL]}
# char against byte-level BPE (docs/benchmarks.md): the 72 s preset with three seeds for char and BPE 512 (single
# runs of one preset differ by a few hundredths) and BPE 1024 once; --long adds char and BPE 512 at 15 minutes
BPE = ["tokenizer=bpe"]
SEEDS = (1, 2, 3)
TOKENIZER_RUNS = {**{f"budget-72s, char, seed {s}": ["experiment=budget-72s", f"train.seed={s}"] for s in SEEDS},
                  **{f"budget-72s, BPE 512, seed {s}": ["experiment=budget-72s", *BPE, f"train.seed={s}"]
                     for s in SEEDS},
                  "budget-72s, BPE 1024": ["experiment=budget-72s", *BPE, "tokenizer.vocab_size=1024"]}
LONG_TOKENIZER_RUNS = {"budget-15m, char": ["experiment=budget-15m"],
                       "budget-15m, BPE 512": ["experiment=budget-15m", *BPE]}
# the smoke's 3-second clock is not the clock a machine choice was made for: its shape and precision set by hand,
# the small shape made tiny so that 3 s are enough steps to learn on any CPU
SMOKE_RUNS = {**{f"budget-72s preset, 3 s, seed {s}": ["experiment=budget-72s", *BUDGET_SMOKE,
                                                      *SEPARATE_FIGURES, f"train.seed={s}"] for s in (1, 2)},
              "budget-72s, BPE 300, 3 s": ["experiment=budget-72s", *BUDGET_SMOKE, "tokenizer=bpe",
                                           "tokenizer.vocab_size=300"]}
QUIET = ["train.sample_length=0"]


def nanogpt_style_estimate(checkpoint_metrics: dict, params, work: Path) -> float:
    """nanoGPT's estimate_loss: the mean loss of 20 random val batches (batch 12, the model's block), in bpc (of the
    output mixed with its n-gram under model.ngram_expert)."""
    model = model_from_checkpoint(load_checkpoint(Path(checkpoint_metrics["checkpoint"])), torch.device("cpu"), "best")
    val = torch.as_tensor(load_ids(work / ENCODED_DIR, "val").astype(np.int64))
    priors = (load_heldout_priors(work / SOFT_TARGETS_DIR, work / ENCODED_DIR)["val"] if model.config.ngram_expert
              else None)
    gen = torch.Generator().manual_seed(0)
    block = model.config.block_size
    batches = []
    for _ in range(20):
        starts = torch.randint(len(val) - block - 1, (12,), generator=gen)
        index = starts[:, None] + torch.arange(block)
        batches.append((val[index], val[index + 1], *([] if priors is None else [priors.at(index + 1)])))
    return evaluate_model(model, batches) / math.log(2)


def one_run(name: str, overrides: list[str], work: Path, corpus: Path) -> dict:
    params = compose_project(work, corpus, [*overrides, *QUIET])
    refresh_tokens(work)  # this run's tokenizer (tokenizer=bpe …) and soft targets; the clean text unchanged
    clear_checkpoints(work)
    started = time.perf_counter()
    report = run_preflight(params, work)
    preflight_s = time.perf_counter() - started
    if not report["passed"]:  # the gate refuses this configuration: recorded, and the next run goes on
        print(f"  preflight failed ({', '.join(report['failed'])}): not trained", flush=True)
        return {"name": name, "overrides": overrides, "preflight_failed": report["failed"]}
    summary = train(params, work, out=lambda msg: print(f"  {msg}", flush=True))
    try:
        metrics = evaluate_checkpoint(params, work)
    except MinigptError as refused:  # evaluate's own bar (the unigram baseline): a result, and the next run goes on
        print(f"  evaluate refused the model: {refused}", flush=True)
        return {"name": name, "overrides": overrides, "steps": summary["steps"], "evaluate_refused": str(refused)}
    machine = report.get("machine")
    return {"name": name, "overrides": overrides, "commit": manifest(machine_label())["commit"],
            "parameters": summary["parameters"], "steps": summary["steps"],
            "model": summary["model"], "precision": summary["precision"],
            "shape": params.shape, "machine_choice": machine and {"shape": machine["shape"], "how": machine["how"]},
            "stopped_by": summary["stopped_by"], "train_seconds": summary["train_seconds"],
            "tokens_per_sec_median": summary["tokens_per_sec_median"], "preflight_seconds": preflight_s,
            "tokens_seen": summary["steps"] * params.train.batch_size * params.model.block_size,
            "val_bpc": metrics["val"]["bpc"], "test_bpc": metrics["test"]["bpc"],
            # nanoGPT's per-token estimate is bits per character for a character tokenizer only
            "val_bpc_20_random_batches": nanogpt_style_estimate(metrics, params, work)
            if params.tokenizer.kind == "char" else None,
            "tokenizer": params.section_dict("tokenizer"), "train": params.section_dict("train"),
            "soft_targets": params.section_dict("soft_targets"),
            "dynamic_val_bpc": metrics["dynamic"]["val"]["bpc"] if "dynamic" in metrics else None,
            "dynamic_evaluation": {"lr": params.evaluate.dynamic_lr, "streams": params.evaluate.dynamic_streams}
            if "dynamic" in metrics else None,
            "mixture_val_bpc": metrics["mixture"]["val"]["bpc"] if "mixture" in metrics else None,
            "mixture_test_bpc": metrics["mixture"]["test"]["bpc"] if "mixture" in metrics else None,
            "mixture_weight": metrics["mixture"]["weight"] if "mixture" in metrics else None,
            "watchdog_warnings": summary["warnings"], "best_step": metrics["best_step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a folder with wiki.{train,valid,test}.raw")
    parser.add_argument("--smoke", action="store_true", help="one 3-second run on the synthetic fixture (not a result)")
    parser.add_argument("--long", action="store_true", help="also run the 15-minute preset (with --tokenizers: "
                        "char and BPE 512)")
    parser.add_argument("--tokenizers", action="store_true",
                        help="char vs BPE at the 72 s preset (char and BPE 512 three seeds each, BPE 1024 once)")
    parser.add_argument("--run", nargs="+", action="append", metavar=("NAME", "OVERRIDE"),
                        help="an extra run: a name, then Hydra overrides (repeatable); replaces the default runs")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / ".work", help="scratch project folder")
    parser.add_argument("--append", action="store_true",
                        help="keep the runs already in --out (the same machine only), replacing those of the same "
                             "name; their manifest is kept under 'earlier'")
    parser.add_argument("--out", type=Path,
                        help="default: benchmarks/results/quality_budget/<machine class>.json (smoke: a scratch "
                             "folder)")
    args = parser.parse_args()
    args.out = args.out or results_path("quality_budget")
    if args.smoke:
        scratch = Path(tempfile.mkdtemp(prefix="minigpt-quality-"))
        args.corpus, args.work, runs = synthetic_corpus(scratch / "corpus"), scratch / "project", SMOKE_RUNS
        args.out = scratch / "results_quality.json"
    elif args.corpus is None:
        parser.error("--corpus is required (or --smoke)")
    else:
        presets = (TOKENIZER_RUNS, LONG_TOKENIZER_RUNS) if args.tokenizers else (RUNS, LONG_RUNS)
        runs = {r[0]: r[1:] for r in args.run} if args.run else {**presets[0], **(presets[1] if args.long else {})}
    kept, earlier = earlier_runs(args.out, runs, args.corpus) if args.append else ([], [])
    prepare_project(args.work, args.corpus)
    results = []
    for name, overrides in runs.items():
        print(f"== {name}: {' '.join(overrides)}", flush=True)
        results.append(one_run(name, overrides, args.work, args.corpus))
        print_table(results)
        # after every run: a long series keeps what it finished
        write_results(args.out, args.corpus, kept + results, earlier)
    print_groups(seed_groups(results))
    print(f"\nwrote {args.out}")


def write_results(path: Path, corpus: Path, results: list[dict], earlier: list[dict] | None = None) -> None:
    write_result(path, {"machine": machine_label(), "corpus": str(corpus), "runs": results,
                        "seed_groups": seed_groups(results), **({"earlier": earlier} if earlier else {})})


def earlier_runs(path: Path, runs: dict, corpus: Path) -> tuple[list[dict], list[dict]]:
    """--append: the runs of `path` this invocation does not rerun, and the manifests they came with (its own and
    those it kept); refused when the file was measured on another machine or another corpus."""
    if not path.exists():
        return [], []
    data = json.loads(path.read_text())
    label, theirs = machine_label(), data.get("machine", {})
    same = ("cpu", "cpu_family_model", "isa", "cores", "torch")
    if any(label.get(key) != theirs.get(key) for key in same):
        raise SystemExit(f"{path}: measured on another machine ({machine_kind(theirs)}, "
                         f"{theirs.get('cpu_family_model')}); --append adds runs of this machine only: "
                         "give another --out")
    if Path(data.get("corpus", "")).resolve() != corpus.resolve():
        raise SystemExit(f"{path}: measured on the corpus {data.get('corpus')}, not {corpus}; --append adds runs of "
                         "the same corpus only: give another --out")
    kept = [r for r in data.get("runs", []) if r["name"] not in runs]
    return kept, [*data.get("earlier", []), data["manifest"]] if kept else []


def seed_groups(results: list[dict]) -> list[dict]:
    """Runs named "..., seed N" grouped by the rest of their name: per group the seeds' val and test bpc, mean and
    standard deviation, and B - A of the means against the first group with a 95% interval from the seeds' spread
    alone (Welch's t). The text's own noise is left out (it largely cancels between models scored on the same
    text); the benchmark keeps no eval blocks, which `report diff` would resample for it."""
    by_name: dict[str, list[dict]] = {}
    for r in results:
        name, _, seed = r["name"].rpartition(", seed ")
        if name and seed.isdigit() and "val_bpc" in r:
            by_name.setdefault(name, []).append(r)
    groups = []
    for name, runs in by_name.items():
        seeds = [next((o for o in r["overrides"] if o.startswith("train.seed=")), "default seed") for r in runs]
        group = {"name": name, "seeds": seeds}
        for split in ("val", "test"):
            values = np.array([r[f"{split}_bpc"] for r in runs])
            group[split] = {"bpc": values.tolist(), "mean": float(values.mean()),
                            "sd": float(values.std(ddof=1)) if len(values) > 1 else None}
        groups.append(group)
    for group in groups[1:]:
        group["minus_first"] = {split: welch(groups[0][split]["bpc"], group[split]["bpc"]) for split in ("val", "test")}
    return groups


def welch(a: list[float], b: list[float]) -> dict | None:
    """mean(b) - mean(a) with its 95% Welch interval over the two spreads (None below two values a side)."""
    if min(len(a), len(b)) < 2:
        return None
    difference = float(np.mean(b) - np.mean(a))
    interval = welch_interval(difference, [(np.var(a, ddof=1) / len(a), len(a) - 1),
                                           (np.var(b, ddof=1) / len(b), len(b) - 1)])
    return {"difference": difference, "ci95": interval["ci95"],
            **({"df": interval["df"]} if math.isfinite(interval["df"]) else {})}


def print_groups(groups: list[dict]) -> None:
    for group in groups:
        cells = "  ".join(f"{split} {group[split]['mean']:.3f} ± {group[split]['sd'] or 0:.3f}"
                          for split in ("val", "test"))
        print(f"{group['name']} ({len(group['val']['bpc'])} seeds): {cells}")
        for split, row in (group.get("minus_first") or {}).items():
            if row:
                print(f"   {split} minus {groups[0]['name']}: {row['difference']:+.3f} "
                      f"[{row['ci95'][0]:+.3f}, {row['ci95'][1]:+.3f}] (seeds' spread, Welch)")


def _or_dash(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(results: list[dict]) -> None:
    print(f"\n{'run':<34} {'params':>9} {'steps':>6} {'train s':>8} {'tok/s':>7} {'val bpc':>8} {'20-batch':>8} "
          f"{'test bpc':>8} {'dynamic':>8} {'mixture':>8} {'warn':>4}")
    for r in results:
        if "preflight_failed" in r:
            print(f"{r['name']:<34} preflight failed: {', '.join(r['preflight_failed'])}")
            continue
        if "evaluate_refused" in r:
            print(f"{r['name']:<34} {r['steps']} steps, evaluate refused it (not better than the unigram)")
            continue
        print(f"{r['name']:<34} {r['parameters']:>9,} {r['steps']:>6} {r['train_seconds']:>8.1f} "
              f"{r['tokens_per_sec_median']:>7,.0f} {r['val_bpc']:>8.3f} {_or_dash(r['val_bpc_20_random_batches']):>8} "
              f"{r['test_bpc']:>8.3f} {_or_dash(r.get('dynamic_val_bpc')):>8} "
              f"{_or_dash(r.get('mixture_val_bpc')):>8} {r.get('watchdog_warnings', 0):>4}")
    print(flush=True)


if __name__ == "__main__":
    main()
