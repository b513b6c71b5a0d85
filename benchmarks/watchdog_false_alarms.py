"""The watchdogs on healthy runs: every shipped preset trained through the real gate over many seeds, counting
the warnings and stops they raise (a healthy run should raise none), with each run's val bpc against the baselines.

    python benchmarks/watchdog_false_alarms.py --corpus ../shared/wt2-mini --presets debug budget-72s --seeds 20
    python benchmarks/watchdog_false_alarms.py --smoke        # the code paths on the tests' fixture (CI)
    python benchmarks/watchdog_false_alarms.py --corpus ../shared/wt2-mini --presets budget-15m --first-seed 2 \
        --seeds 7 --append --out FILE                         # a slice of a long preset, added to FILE's rows

The results file is rewritten after every run, so a slice stopped midway keeps the runs it finished; with --append
the rows already in --out are kept (each row names its machine) and the summary covers them all: per preset the
counts, the val bpc range, and the val and test mean, sd and 95% t-interval of the mean over the seeds.

Each run: preflight (the real checks, so the throughput watchdog gets preflight's timing as its reference), then
train with train.seed = preflight.seed = seed, then evaluate (val bpc and the baseline ladder). Run it alone on
the machine: another job on the cores slows the runs, and the throughput watchdog rightly says so.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench_common import (
    clear_checkpoints,
    compose_project,
    machine_kind,
    machine_label,
    manifest,
    output_path,
    prepare_project,
    refresh_tokens,
    synthetic_corpus,
)
from minigpt.evaluate.checkpoint_eval import evaluate_checkpoint
from minigpt.evaluate.scoring_checks import ScoringCheckFailed
from minigpt.preflight.suite import run_preflight
from minigpt.testing.false_alarm_rows import earlier_rows, summarise, tokens_stale, write_results
from minigpt.train.loop import train
from minigpt.train.training_checks import TrainingCheckFailed
from minigpt.train.watchdogs import WatchdogStop

PRESETS = {"debug": ["experiment=debug"], "budget-72s": ["experiment=budget-72s"],
           "budget-15m": ["experiment=budget-15m"], "production": []}
QUIET = ["train.sample_length=200"]


def one_run(preset: str, seed: int, work: Path, corpus: Path, extra: list[str], built: dict) -> dict:
    params = compose_project(work, corpus, [*PRESETS[preset], *QUIET, f"train.seed={seed}", f"preflight.seed={seed}",
                                            *extra])
    if tokens_stale(params, built):  # the budget presets train on soft targets the default params do not build
        refresh_tokens(work)
    clear_checkpoints(work)
    started = time.perf_counter()
    report = run_preflight(params, work)
    row = {"preset": preset, "seed": seed, "preflight_passed": report["passed"], "failed": report["failed"]}
    if not report["passed"]:
        return row
    try:
        summary = train(params, work, out=lambda _m: None)
        metrics = evaluate_checkpoint(params, work)
    except WatchdogStop as stop:
        return {**row, "stopped": str(stop), "seconds": time.perf_counter() - started}
    except (TrainingCheckFailed, ScoringCheckFailed) as failed:
        return {**row, "check_failed": str(failed), "seconds": time.perf_counter() - started}
    watch = summary["watchdogs"]
    # the checks train and evaluate record about themselves (a failed one raises above)
    recorded = {**summary["checks"], **metrics["scoring_checks"]}
    return {**row, "steps": summary["steps"], "shape": params.shape,
            "precision": summary["precision"], "tokens_per_sec_median": summary["tokens_per_sec_median"],
            "clipped_fraction": summary["clipped_fraction"], "warnings": summary["warnings"],
            "fired": {n: c for n, c in watch["checks"].items() if c["fired"]},
            "runtime_checks_passed": sorted(n for n, c in recorded.items() if c["passed"]),
            "evaluated": {n: c["evaluated"] for n, c in watch["checks"].items()},
            "throughput_reference": watch["reference_tokens_per_s"], "reference": watch["reference"],
            "val_bpc": metrics["val"]["bpc"], "test_bpc": metrics["test"]["bpc"],
            "vs_best_static_bpc": metrics["baselines"]["vs_best_static_bpc"],
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a WikiText-format folder (default: the tests' fixture)")
    parser.add_argument("--presets", nargs="+", default=["debug", "budget-72s"], choices=list(PRESETS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=1, help="seeds first-seed .. first-seed + seeds - 1 (run "
                        "the long presets in slices)")
    parser.add_argument("--override", nargs="*", default=[], help="Hydra overrides for every run")
    parser.add_argument("--smoke", action="store_true", help="2 seeds of a 40-step debug run on the fixture")
    parser.add_argument("--out", type=Path,
                        help="default: benchmarks/results/watchdog_false_alarms/<machine class>.json")
    parser.add_argument("--append", action="store_true", help="keep the rows already in --out (run in slices)")
    args = parser.parse_args()
    label = machine_label()
    presets, seeds, extra = args.presets, args.seeds, list(args.override)
    if args.smoke:
        presets, seeds, extra = ["debug"], 2, extra + ["train.max_steps=40", "train.eval_every=10", "watch.window=10"]
    args.out = output_path(args.out, "watchdog_false_alarms", args.smoke)
    rows = earlier_rows(args.out) if args.append else []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) / "project"
        corpus = args.corpus.resolve() if args.corpus else synthetic_corpus(Path(scratch) / "corpus")
        prepare_project(work, corpus)
        built: dict = {}
        for preset in presets:
            for seed in range(args.first_seed, args.first_seed + seeds):
                row = one_run(preset, seed, work, corpus, extra, built)
                rows.append({"machine": machine_kind(label), "cpu_family_model": label["cpu_family_model"], **row})
                write_results(args.out, label, args.smoke, rows, manifest(label))
                fired = ", ".join(f"{n} x{c['fired']}" for n, c in row.get("fired", {}).items()) or "none"
                print(f"{preset:<11} seed {seed:>3}: "
                      + (f"preflight failed {row['failed']}" if not row["preflight_passed"] else
                         f"STOPPED {row['stopped']}" if "stopped" in row else
                         f"CHECK FAILED {row['check_failed']}" if "check_failed" in row else
                         f"{row['steps']} steps, val {row['val_bpc']:.4f} bpc (vs best static "
                         f"{row['vs_best_static_bpc']:+.4f}), warnings {row['warnings']} ({fired}), "
                         f"{row['seconds']:.0f} s"), flush=True)
    for preset, line in summarise(rows).items():
        print(f"{preset}: {json.dumps(line)}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
