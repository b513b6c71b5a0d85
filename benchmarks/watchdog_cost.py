"""What the watchdogs (and the weight average of train.ema_decay) cost per training step, measured side by side with
the step itself in one run.

    python benchmarks/watchdog_cost.py --out benchmarks/results/watchdog_cost_<machine>.json
    python benchmarks/watchdog_cost.py --smoke        # the code paths, a few steps (CI)

For each preset's model and batch (the run's own training step, optimizer and precision): every step is timed,
then the watchdogs' per-step call on that step's real optimizer and gradients, then (once per train.eval_every
steps, amortised) their per-eval call with a sample of train.sample_length characters. The ratio of the two sums
is the watchdogs' share of a step; the issue asks for under 1%. The moving average's update
(minigpt.train.weight_average), timed after them on the same step, is reported as its own share.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from bench_common import (
    compose_project,
    machine_kind,
    machine_label,
    output_path,
    synthetic_corpus,
    write_result,
)
from minigpt.data import batching
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step
from minigpt.train.watchdogs import Watchdogs
from minigpt.train.weight_average import WeightAverage

PRESETS = {"debug": ["experiment=debug"], "production": ["train.precision=bf16"],
           "budget shape small": ["experiment=budget-72s", "train.precision=bf16"]}
VOCAB = 119  # wt2-mini's vocabulary


def measure(params, steps: int) -> dict:
    cfg = params.train
    torch.manual_seed(0)
    model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB))
    optimizer = train_step.make_optimizer(model, cfg)
    ids = torch.randint(0, VOCAB, (200_000,))
    gen = torch.Generator().manual_seed(0)
    watch = Watchdogs(params.watch, cfg.grad_clip, params.clean.placeholder, None, lambda _m: None)
    sample = "".join(random.Random(0).choice("abcdefgh ") for _ in range(cfg.sample_length))
    average = WeightAverage(model, 0.999)
    step_s = watch_s = average_s = 0.0
    for step in range(1, steps + 1):
        inputs, targets = batching.get_batch(ids, cfg.batch_size, params.model.block_size, "cpu", gen)
        started = time.perf_counter()
        result = train_step.training_step(model, optimizer, inputs, targets, cfg.lr, cfg.precision, cfg.grad_clip)
        stepped = time.perf_counter()
        watch.after_step(step, cfg.lr, optimizer, model, result.grad_norm, result.loss, 1000.0)
        if step % cfg.eval_every == 0:
            watch.after_eval(step, 3.0 - step * 1e-4, sample)
        done = time.perf_counter()
        average.update(model)
        averaged = time.perf_counter()
        if step > 3:  # the first steps allocate
            step_s += stepped - started
            watch_s += done - stepped
            average_s += averaged - done
    # the per-eval call, timed on its own and spread over eval_every steps (a run this short may not reach one)
    started = time.perf_counter()
    for i in range(20):
        watch.after_eval(steps + i, 2.0, sample)
    per_eval = (time.perf_counter() - started) / 20
    counted = steps - 3
    return {"steps": counted, "step_ms": 1000 * step_s / counted, "watchdogs_ms": 1000 * watch_s / counted,
            "eval_call_ms": 1000 * per_eval, "eval_every": cfg.eval_every,
            "share": (watch_s / counted + per_eval / cfg.eval_every) / (step_s / counted),
            "average_ms": 1000 * average_s / counted, "average_share": average_s / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="the debug preset, 8 steps")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/watchdog_cost/<machine class>.json")
    args = parser.parse_args()
    label = machine_label()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        corpus = synthetic_corpus(Path(scratch) / "corpus")
        for preset, overrides in PRESETS.items():
            if args.smoke and preset != "debug":
                continue
            params = compose_project(Path(scratch), corpus, overrides)
            row = {"preset": preset, "machine": machine_kind(label), "precision": params.train.precision,
                   **measure(params, 8 if args.smoke else args.steps)}
            rows.append(row)
            print(f"{preset:<20} step {row['step_ms']:8.2f} ms, watchdogs {row['watchdogs_ms'] * 1000:7.1f} µs/step "
                  f"+ {row['eval_call_ms'] * 1000:.0f} µs per eval = {row['share']:.3%} of a step; weight average "
                  f"{row['average_ms'] * 1000:.0f} µs/step = {row['average_share']:.3%}", flush=True)
    args.out = output_path(args.out, "watchdog_cost", args.smoke)
    write_result(args.out, {"machine": label, "smoke": args.smoke, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
