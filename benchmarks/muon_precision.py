"""Muon's orthogonalisation precision on this CPU: the budget shapes' fp32 training step with Newton-Schulz in bf16
(torch.optim.Muon's, what every run did before) against fp32 (what an fp32 run does now, minigpt/train/muon.py),
measured side by side in interleaved rounds. (A bf16 run orthogonalises in bf16 as before; whether bf16 or fp32
trains faster on a machine is what preflight times, train.precision=auto.)

    python benchmarks/muon_precision.py --out benchmarks/results/muon_precision_<machine>.json
    python benchmarks/muon_precision.py --smoke        # seconds (CI): tiny model, one round
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from compile_step import SMOKE_SHAPE, VOCAB, shape_params

from bench_common import machine_label
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

# (name, training precision, Muon's orthogonalisation precision)
MODES = [("fp32 step, orthogonalised in bf16 (before)", "fp32", "bf16"),
         ("fp32 step, orthogonalised in fp32 (now)", "fp32", "fp32")]


def make_runner(params, precision: str, orthogonalise: str):
    torch.manual_seed(0)
    model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB))
    optimizer = train_step.make_optimizer(model, params.train)

    def step(inputs, targets):
        train_step.training_step(model, optimizer, inputs, targets, params.train.lr, precision, params.train.grad_clip)
        optimizer.muon.precision = orthogonalise  # what training_step set, replaced for the next step

    return step


def measure(shape: str, overrides: list[str], steps: int, rounds: int, scratch: Path) -> dict:
    params = shape_params(shape, overrides, scratch)
    block, batch = params.model.block_size, params.train.batch_size
    gen = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, VOCAB, (batch, block), generator=gen)
    targets = torch.randint(0, VOCAB, (batch, block), generator=gen)
    runners = {name: make_runner(params, precision, ortho) for name, precision, ortho in MODES}
    for runner in runners.values():  # the optimizer state exists, and the precision is set, from here on
        runner(inputs, targets)
    rates = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            started = time.perf_counter()
            for _ in range(steps):
                runner(inputs, targets)
            rates[name].append(steps * batch * block / (time.perf_counter() - started))
    before = statistics.median(rates[MODES[0][0]])
    return {"shape": shape, "optimizer": params.train.optimizer, "model": params.model.model_dump(),
            "batch": [batch, block], "tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
            "ratio_to_before": {m: statistics.median(r) / before for m, r in rates.items()}, "rounds": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-muon-"))
    overrides, shapes = [], ("small", "production")
    if args.smoke:
        overrides = SMOKE_SHAPE
        args.steps, args.rounds, shapes = 1, 1, ("small",)
    results = [measure(shape, overrides, args.steps, args.rounds, scratch) for shape in shapes]
    for result in results:
        for name, rate in result["tokens_per_s"].items():
            print(f"{result['shape']:<11} {name:<44} {rate:>8,.0f} tokens/s ({result['ratio_to_before'][name]:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_label(), "shapes": results}, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
