"""Muon's orthogonalisation on this CPU: the budget shapes' fp32 training step with Newton-Schulz in bf16
(torch.optim.Muon's), in fp32 one matrix at a time, and in fp32 with the matrices of one shape orthogonalised
together as one batch (what an fp32 run does, minigpt/train/muon.py), measured side by side in interleaved rounds.
With --precision bf16, the bf16 step (a CPU with bf16 instructions) orthogonalising in bf16 one matrix at a time
(torch's) and by shape (what a bf16 run does). Whether bf16 or fp32 trains faster on a machine is what `make
machine` times (train.precision=auto).

    python benchmarks/muon_precision.py                    # benchmarks/results/muon_precision/<machine class>.json
    python benchmarks/muon_precision.py --precision bf16   # ... <machine class>-bf16.json
    python benchmarks/muon_precision.py --smoke        # seconds (CI): tiny model, one round
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench_common import VOCAB, interleaved_rates, random_batch, run_shapes, shape_params, shape_rates, timing_parser
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

# (name, training precision, Muon's orthogonalisation precision, same-shaped matrices together)
MODES = {"fp32": [("fp32 step, orthogonalised in bf16 (torch's)", "fp32", "bf16", False),
                  ("fp32 step, in fp32 one matrix at a time", "fp32", "fp32", False),
                  ("fp32 step, in fp32 by shape (now)", "fp32", "fp32", True)],
         "bf16": [("bf16 step, in bf16 one matrix at a time (torch's)", "bf16", "bf16", False),
                  ("bf16 step, in bf16 by shape (now)", "bf16", "bf16", True)]}


def make_runner(params, precision: str, orthogonalise: str, by_shape: bool):
    torch.manual_seed(0)
    model = MiniGPT(MiniGPTConfig.from_params(params.model, VOCAB))
    optimizer = train_step.make_optimizer(model, params.train)

    def step(inputs, targets):
        train_step.training_step(model, optimizer, inputs, targets, params.train.lr, precision, params.train.grad_clip)
        optimizer.muon.precision = orthogonalise  # what training_step set, replaced for the next step
        optimizer.muon.by_shape = by_shape

    return step


def measurer(modes: list[tuple]):
    def measure(shape: str, overrides: list[str], steps: int, rounds: int, scratch: Path) -> dict:
        params = shape_params(shape, overrides, scratch)
        inputs, targets = random_batch(params)
        runners = {name: make_runner(params, *mode) for name, *mode in modes}
        for runner in runners.values():  # the optimizer state exists, and the precision is set, from here on
            runner(inputs, targets)
        return shape_rates(shape, params, interleaved_rates(runners, inputs, targets, steps, rounds), modes[0][0])

    return measure


def main() -> None:
    parser = timing_parser(__doc__, steps=5, rounds=3)
    parser.add_argument("--precision", choices=sorted(MODES), default="fp32", help="the training step's precision")
    args = parser.parse_args()
    # bf16 steps' results kept beside the fp32 ones: <machine class>-bf16.json
    run_shapes(measurer(MODES[args.precision]), args, "muon_precision", "" if args.precision == "fp32" else "bf16")

if __name__ == "__main__":
    main()
