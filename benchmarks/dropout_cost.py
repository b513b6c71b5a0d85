"""What dropout costs a CPU training step: the budget shapes' real step (dropout 0.1) with torch's dropout (one
Mersenne Twister draw per element, what every run did before), with minigpt's (minigpt/model/dropout.py: 16-bit
integers cut from 64-bit draws), with minigpt's and no dropout on the attention weights
(model.attention_dropout=false, which lets scaled_dot_product_attention take its fused kernel), and with dropout 0
(another model: the floor), measured side by side in interleaved rounds.

    python benchmarks/dropout_cost.py --out benchmarks/results/dropout_cost_<machine>.json
    python benchmarks/dropout_cost.py --precision bf16
    python benchmarks/dropout_cost.py --smoke        # seconds (CI): tiny model, one round
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench_common import VOCAB, interleaved_rates, random_batch, run_shapes, shape_params, shape_rates, timing_parser
from minigpt.model.dropout import Dropout
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

DROPOUT = 0.1
BEFORE = "torch's dropout (before)"
# (name, model overrides, torch's dropout swapped in)
MODES = [(BEFORE, {}, True),
         ("minigpt's dropout (now)", {}, False),
         ("minigpt's dropout, attention_dropout=false", {"attention_dropout": False}, False),
         ("dropout 0 (another model: the floor)", {"dropout": 0.0}, False)]


def with_torch_dropout(model: torch.nn.Module) -> torch.nn.Module:
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Dropout):
                setattr(module, name, torch.nn.Dropout(child.p))
    return model


def make_runner(params, model_overrides: dict, torch_dropout: bool, precision: str):
    torch.manual_seed(0)
    config = MiniGPTConfig.from_params(params.model.model_copy(update=model_overrides), VOCAB)
    model = MiniGPT(config)
    if torch_dropout:
        with_torch_dropout(model)
    optimizer = train_step.make_optimizer(model, params.train)
    cfg = params.train

    def step(inputs, targets):
        train_step.training_step(model, optimizer, inputs, targets, cfg.lr, precision, cfg.grad_clip)

    return step


def measure(shape: str, overrides: list[str], precision: str, steps: int, rounds: int, scratch: Path) -> dict:
    params = shape_params(shape, [f"model.dropout={DROPOUT}", *overrides], scratch)
    inputs, targets = random_batch(params)
    runners = {name: make_runner(params, update, swap, precision) for name, update, swap in MODES}
    for runner in runners.values():  # warm-up: optimizer state allocated, kernels chosen
        runner(inputs, targets)
    rates = interleaved_rates(runners, inputs, targets, steps, rounds)
    return {**shape_rates(shape, params, rates, BEFORE), "precision": precision, "dropout": DROPOUT}


def main() -> None:
    parser = timing_parser(__doc__, steps=5, rounds=5)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    args = parser.parse_args()

    def in_precision(shape, overrides, steps, rounds, scratch):
        return measure(shape, overrides, args.precision, steps, rounds, scratch)

    run_shapes(in_precision, args, "dropout_cost")


if __name__ == "__main__":
    main()
