"""Attention's precision inside a bf16 training step on this CPU: the budget shapes' real step in fp32, in bf16
with attention in bf16 (model.attention_precision=step, what bf16 runs did before), and in bf16 with attention in
fp32 (attention_precision=fp32: q, k, v cast up, scaled_dot_product_attention in fp32, its output cast back), and
that without attention dropout (another model where dropout > 0: the production shape drops its attention weights,
which keeps attention off the fused kernel), measured side by side in interleaved rounds.

    python benchmarks/attention_precision.py --out benchmarks/results/attention_precision_<machine>.json
    python benchmarks/attention_precision.py --smoke        # seconds (CI): tiny model, one round
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench_common import VOCAB, interleaved_rates, random_batch, run_shapes, shape_params, shape_rates, timing_parser
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

BEFORE = "bf16 step, attention in bf16 (before)"
# (name, the step's precision, model overrides on the shape as conf/budget/default.yaml defines it)
MODES = [("fp32 step", "fp32", {"attention_precision": "step"}),
         (BEFORE, "bf16", {"attention_precision": "step"}),
         ("bf16 step, attention in fp32 (now)", "bf16", {"attention_precision": "fp32"}),
         ("bf16 step, no attention dropout, attention in fp32", "bf16",
          {"attention_precision": "fp32", "attention_dropout": False})]


def make_runner(params, precision: str, model_overrides: dict):
    torch.manual_seed(0)
    model = MiniGPT(MiniGPTConfig.from_params(params.model.model_copy(update=model_overrides), VOCAB))
    optimizer = train_step.make_optimizer(model, params.train)
    cfg = params.train

    def step(inputs, targets):
        train_step.training_step(model, optimizer, inputs, targets, cfg.lr, precision, cfg.grad_clip)

    return step


def measure(shape: str, overrides: list[str], steps: int, rounds: int, scratch: Path) -> dict:
    params = shape_params(shape, overrides, scratch)
    inputs, targets = random_batch(params)
    runners = {name: make_runner(params, precision, update) for name, precision, update in MODES}
    for runner in runners.values():  # warm-up: optimizer state allocated, kernels chosen
        runner(inputs, targets)
    return shape_rates(shape, params, interleaved_rates(runners, inputs, targets, steps, rounds), BEFORE)


def main() -> None:
    args = timing_parser(__doc__, steps=5, rounds=5).parse_args()
    run_shapes(measure, args, "attention_precision")


if __name__ == "__main__":
    main()
