"""torch.compile on this CPU: the run's training step eager, with the model compiled (train.compile=true), and with
the whole step (forward, backward, clipping, optimizer) compiled, measured side by side in interleaved rounds.

    python benchmarks/compile_step.py                       # the budget shape `small` as conf/budget/ sets it
    python benchmarks/compile_step.py --shape production --precision fp32
    python benchmarks/compile_step.py --smoke               # seconds (CI): tiny model, one round

Compilation time is measured separately (the first calls) and excluded from the tokens/s medians.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench_common import (
    SMOKE_SHAPE,
    VOCAB,
    interleaved_rates,
    machine_label,
    output_path,
    random_batch,
    shape_params,
    timing_parser,
    write_result,
)
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step


def make_runner(params, mode: str, seed: int = 0):
    torch.manual_seed(seed)
    model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB))
    optimizer = train_step.make_optimizer(model, params.train)
    cfg = params.train
    forward_model = torch.compile(model) if mode == "model compiled" else model

    def step(inputs, targets):
        return train_step.training_step(forward_model, optimizer, inputs, targets, cfg.lr, cfg.precision,
                                        cfg.grad_clip, model.parameters())

    return torch.compile(step) if mode == "whole step compiled" else step


def main() -> None:
    parser = timing_parser(__doc__, steps=20, rounds=3)
    parser.add_argument("--shape", default="small")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-compile-"))
    overrides = [f"train.precision={args.precision}"]
    if args.smoke:
        overrides += SMOKE_SHAPE
        args.steps, args.rounds = 2, 1
    params = shape_params(args.shape, overrides, scratch)
    block, batch = params.model.block_size, params.train.batch_size
    inputs, targets = random_batch(params)
    modes = ["eager", "model compiled", "whole step compiled"]
    runners, compile_s = {}, {}
    for mode in modes:
        runners[mode] = make_runner(params, mode)
        started = time.perf_counter()
        for _ in range(3):  # compiles (and recompiles once the optimizer state exists)
            runners[mode](inputs, targets)
        compile_s[mode] = time.perf_counter() - started
    rates = interleaved_rates(runners, inputs, targets, args.steps, args.rounds)
    eager = statistics.median(rates["eager"])
    result = {"machine": machine_label(), "shape": args.shape, "precision": args.precision,
              "optimizer": params.train.optimizer, "model": params.model.model_dump(), "batch": [batch, block],
              "tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
              "ratio_to_eager": {m: statistics.median(r) / eager for m, r in rates.items()},
              "first_three_steps_s": compile_s, "rounds": rates}
    for mode in modes:
        print(f"{mode:<22} {result['tokens_per_s'][mode]:>9,.0f} tokens/s  ({result['ratio_to_eager'][mode]:.2f}x "
              f"eager; first 3 steps {compile_s[mode]:.1f} s)")
    out = output_path(args.out, "compile_step", args.smoke)
    write_result(out, result)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
