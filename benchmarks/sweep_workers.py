"""A queued LR sweep with 1 and 2 DVC workers, side by side in one run: does a second worker pay off once each
process takes its share of the cores (minigpt/core/thread_share.py), and what did it cost when every process took
every core (the behaviour before, forced here with MINIGPT_THREADS=<cores>)?

    python benchmarks/sweep_workers.py --corpus ../shared/wt2-mini --out benchmarks/results/sweep_workers_<machine>.json

A scratch git + DVC project at debug scale; each mode queues its own LRs (DVC's run cache would skip a repeat)
and times `dvc exp run --run-all -j N` until the queue is empty.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import (
    compose_project,
    copy_into_fresh_repo,
    dvc_env,
    machine_kind,
    machine_label,
    output_path,
    synthetic_corpus,
    write_result,
)
from minigpt.core.thread_share import available_cores
from minigpt.testing.dvc_queue import run_queue


def scratch_repo(work: Path, corpus: Path) -> dict:
    """The project's tracked files in a fresh git repo, baseline run at debug scale and committed."""
    git = copy_into_fresh_repo(work, "bench")
    env = dvc_env()
    compose_project(work, corpus, ["experiment=debug"])
    baseline = subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=work, capture_output=True, text=True,
                              env=env)
    if baseline.returncode:
        raise SystemExit(f"dvc repro in {work} failed:\n{baseline.stdout}{baseline.stderr}")
    git("add", "-A")
    git("commit", "-qm", "baseline")
    return env


def sweep(work: Path, env: dict, corpus: Path, lrs: list[float], workers: int, threads: str | None) -> dict:
    dvc = [sys.executable, "-m", "dvc", "exp"]
    overrides = ["-S", "experiment=debug", "-S", "data=local", "-S", f"data.path={corpus.resolve()}"]
    values = ",".join(f"{lr:g}" for lr in lrs)
    subprocess.run([*dvc, "run", *overrides, "-S", f"train.lr={values}", "--queue"], cwd=work, check=True,
                   capture_output=True, env=env)
    run_env = dict(env)
    if threads:
        run_env["MINIGPT_THREADS"] = threads
    start = time.perf_counter()
    result = run_queue([*dvc, "run", "--run-all", "-j", str(workers)], work, run_env)
    seconds = time.perf_counter() - start
    ran = result.stdout.count("Running stage 'train'")
    return {"workers": workers, "threads_per_process": threads or "share (cores / live processes)",
            "experiments": len(lrs), "trained": ran, "seconds": round(seconds, 1), "returncode": result.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--experiments", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="2 experiments, the 1- and 2-worker modes once")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/sweep_workers/<machine class>.json")
    args = parser.parse_args()
    count = 2 if args.smoke else args.experiments
    cores = str(available_cores())
    modes = [(1, None), (2, None)] if args.smoke else [(1, None), (2, None), (2, cores), (1, None)]
    with tempfile.TemporaryDirectory() as scratch:
        corpus = args.corpus or synthetic_corpus(Path(scratch) / "corpus")
        work = Path(scratch) / "repo"
        env = scratch_repo(work, corpus)
        rows = []
        for i, (workers, threads) in enumerate(modes):
            lrs = [round(1e-3 * (1 + 0.1 * i + 0.5 * k), 6) for k in range(count)]  # new LRs: no run-cache reuse
            row = sweep(work, env, corpus, lrs, workers, threads)
            rows.append({**row, "machine": machine_kind(machine_label())})
            print(f"{workers} worker(s), threads {row['threads_per_process']}: {row['experiments']} experiments "
                  f"({row['trained']} trained) in {row['seconds']} s", flush=True)
    args.out = output_path(args.out, "sweep_workers", args.smoke)
    write_result(args.out, {"machine": machine_label(), "smoke": args.smoke, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
