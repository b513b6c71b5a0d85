"""From `dvc exp run` to metrics under a budget preset, and where the time goes. In a scratch git + DVC project:
the one-time machine command (`make machine`'s), then the preset run once (data stages included), then again with
another `train.lr` (data stages cached: what each point of a sweep costs). Per stage: its wall clock as DVC runs
it (from its "Running stage" line to the next) and what its own process reports ("done in"); the rest of a stage's
wall clock is process start-up and imports, and DVC's work between stages (hashing, dvc.lock).

    python benchmarks/exp_run_time.py --corpus ../shared/wt2-mini
    python benchmarks/exp_run_time.py --smoke      # code paths on the tests' fixture (a tiny shape, a 5 s clock)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import copy_into_fresh_repo, dvc_env, machine_label, output_path, synthetic_corpus, write_result

STAGE_LINE = re.compile(r"^Running stage '(?P<stage>[^']+)'")
DONE_LINE = re.compile(r"^\[(?P<stage>[a-z_]+)\] done in (?P<seconds>[0-9.]+)s")
# --smoke: the small shape made tiny (the tests' fixture has too few tokens for the real one to learn in seconds)
SMOKE_SMALL_SHAPE = """# @package _global_
shape: small
model: {block_size: 32, embedding_dim: 32, num_heads: 2, num_layers: 1, dropout: 0.0, position: rotary,
        qk_norm: true, mlp: swiglu, attention_precision: fp32}
train: {batch_size: 8, lr: 0.01, warmup_steps: 5, betas: [0.9, 0.99], eval_batches: 2, optimizer: muon, grad_clip: 2.0}
"""
PREFLIGHT_LINE = re.compile(r"^\[preflight\] checks .*; preflight (?P<seconds>[0-9.]+) s = ")


def timed_lines(command: list[str], cwd: Path, env: dict) -> tuple[list[tuple[float, str]], float, int]:
    """Every output line of the command with the seconds since it started, its total seconds, its return code."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.perf_counter() - start, line.rstrip("\n")) for line in process.stdout]
    code = process.wait()
    return lines, time.perf_counter() - start, code


def where_time_went(lines: list[tuple[float, str]], total: float) -> dict:
    """Per stage DVC ran: wall clock (its line to the next stage's, the last to the command's end) and the seconds
    its process reported; the seconds before the first stage; preflight's own figure."""
    starts = [(at, m["stage"]) for at, line in lines if (m := STAGE_LINE.match(line))]
    done = {m["stage"]: float(m["seconds"]) for _, line in lines if (m := DONE_LINE.match(line))}
    stages = {}
    for (at, stage), (until, _) in zip(starts, [*starts[1:], (total, None)]):
        stages[stage] = {"wall_s": round(until - at, 2), "in_process_s": done.get(stage)}
    preflight = next((float(m["seconds"]) for _, line in lines if (m := PREFLIGHT_LINE.match(line))), None)
    return {"total_s": round(total, 2), "before_first_stage_s": round(starts[0][0], 2) if starts else None,
            "stages": stages, "preflight_report_s": preflight}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, help="a WikiText-format folder (default: the tests' fixture)")
    parser.add_argument("--preset", default="budget-72s", choices=["budget-72s", "budget-15m"])
    parser.add_argument("--lr", type=float,
                        help="the second run's train.lr (default 0.0015; with --smoke 0.02, the tiny shape's scale)")
    parser.add_argument("--smoke", action="store_true", help="the fixture, a tiny small shape, the clock cut to 5 s")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/exp_run_time/<machine class>.json")
    args = parser.parse_args()
    args.lr = args.lr or (0.02 if args.smoke else 0.0015)
    env = dvc_env()
    with tempfile.TemporaryDirectory() as scratch:
        corpus = (args.corpus or synthetic_corpus(Path(scratch) / "corpus")).resolve()
        work = Path(scratch) / "repo"
        git = copy_into_fresh_repo(work, "bench")
        if args.smoke:  # a clock of seconds, and a small shape tiny enough to learn something in them
            preset = work / "conf" / "experiment" / f"{args.preset}.yaml"
            preset.write_text(re.sub(r"max_seconds: \d+", "max_seconds: 5", preset.read_text()))
            (work / "conf" / "shape" / "small.yaml").write_text(SMOKE_SMALL_SHAPE)
        began = time.perf_counter()
        subprocess.run([sys.executable, "-m", "minigpt.train.machine_command"], cwd=work, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        machine_seconds = time.perf_counter() - began
        git("add", "-A")
        git("commit", "-qm", "the project, with this machine's choices")
        base = [sys.executable, "-m", "dvc", "exp", "run", "-S", "data=local", "-S", f"data.path={corpus}",
                "-S", f"experiment={args.preset}"]
        runs = {}
        for name, extra in (("first, data stages included", []), (f"train.lr={args.lr:g}, data stages cached",
                                                                   ["-S", f"train.lr={args.lr:g}"])):
            lines, total, code = timed_lines(base + extra, work, env)
            if code:
                raise SystemExit(f"dvc exp run failed ({code}):\n" + "\n".join(line for _, line in lines[-30:]))
            runs[name] = where_time_went(lines, total)
            stages = runs[name]["stages"]
            unread = [stage for stage, seconds in stages.items() if seconds["in_process_s"] is None]
            if not stages or unread or runs[name]["preflight_report_s"] is None:
                raise SystemExit(f"{name}: no stage lines, or no 'done in' line for {unread or 'none'}, or no "
                                 "preflight seconds: the output changed; update the patterns at the top of this script")
            print(f"{name}: {total:.1f} s; " + ", ".join(
                f"{stage} {s['wall_s']:.1f} s ({s['in_process_s'] if s['in_process_s'] is not None else '-'})"
                for stage, s in stages.items()), flush=True)
    print(f"machine command: {machine_seconds:.1f} s")
    args.out = output_path(args.out, "exp_run_time", args.smoke)
    write_result(args.out, {"machine": machine_label(), "corpus": str(args.corpus or "fixture"), "preset": args.preset,
                            "smoke": args.smoke, "machine_command_s": round(machine_seconds, 2), "runs": runs})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
