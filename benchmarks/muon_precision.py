"""Muon's orthogonalisation on this CPU: the budget shapes' fp32 training step with Newton-Schulz in bf16
(torch.optim.Muon's), in fp32 one matrix at a time, and in fp32 with the matrices of one shape orthogonalised
together as one batch (what an fp32 run does now, minigpt/train/muon.py), measured side by side in interleaved
rounds. (A bf16 run orthogonalises in bf16, one matrix at a time, as torch does; whether bf16 or fp32 trains
faster on a machine is what preflight times, train.precision=auto.)

    python benchmarks/muon_precision.py --out benchmarks/results/muon_precision_<machine>.json
    python benchmarks/muon_precision.py --smoke        # seconds (CI): tiny model, one round
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench_common import VOCAB, interleaved_rates, random_batch, run_shapes, shape_params, shape_rates, timing_parser
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

# (name, training precision, Muon's orthogonalisation precision, same-shaped matrices together)
MODES = [("fp32 step, orthogonalised in bf16 (torch's)", "fp32", "bf16", False),
         ("fp32 step, in fp32 one matrix at a time", "fp32", "fp32", False),
         ("fp32 step, in fp32 by shape (now)", "fp32", "fp32", True)]


def make_runner(params, precision: str, orthogonalise: str, by_shape: bool):
    torch.manual_seed(0)
    model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB))
    optimizer = train_step.make_optimizer(model, params.train)

    def step(inputs, targets):
        train_step.training_step(model, optimizer, inputs, targets, params.train.lr, precision, params.train.grad_clip)
        optimizer.muon.precision = orthogonalise  # what training_step set, replaced for the next step
        optimizer.muon.by_shape = by_shape

    return step


def measure(shape: str, overrides: list[str], steps: int, rounds: int, scratch: Path) -> dict:
    params = shape_params(shape, overrides, scratch)
    inputs, targets = random_batch(params)
    runners = {name: make_runner(params, *mode) for name, *mode in MODES}
    for runner in runners.values():  # the optimizer state exists, and the precision is set, from here on
        runner(inputs, targets)
    return shape_rates(shape, params, interleaved_rates(runners, inputs, targets, steps, rounds), MODES[0][0])


def main() -> None:
    args = timing_parser(__doc__, steps=5, rounds=3).parse_args()
    run_shapes(measure, args, "muon_precision")

if __name__ == "__main__":
    main()
