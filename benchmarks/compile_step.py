"""torch.compile on this CPU: the run's training step eager, with the model compiled (train.compile=true), and with
the whole step (forward, backward, clipping, optimizer) compiled, measured side by side in interleaved rounds.

    python benchmarks/compile_step.py                       # the budget shape `small` as conf/budget/ sets it
    python benchmarks/compile_step.py --shape production --precision fp32
    python benchmarks/compile_step.py --smoke               # seconds (CI): tiny model, one round

Compilation time is measured separately (the first calls) and excluded from the tokens/s medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench_common import ROOT, machine_label
from minigpt.core.compose import compose_params
from minigpt.core.config import load_params
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step

VOCAB = 119  # wt2-mini's vocabulary
# --smoke: the small budget shape made tiny (code paths in seconds, not timings)
SMOKE_SHAPE = ["model.embedding_dim=32", "model.num_layers=1", "model.block_size=16"]


def shape_params(shape: str, overrides: list[str], scratch: Path):
    """A budget shape forced (conf/shape/), without this machine's stored choice: the benchmark times both."""
    compose_params(scratch / "params.yaml", ROOT / "conf", ["experiment=budget-72s", "machine=none", f"shape={shape}",
                                                           "train.precision=fp32", *overrides])
    return load_params(scratch / "params.yaml")


def timing_parser(doc: str, steps: int, rounds: int) -> argparse.ArgumentParser:
    """The timing benchmarks' shared options: --steps per round, --rounds, --smoke, --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path)
    return parser


def random_batch(params) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed batch of the shape's size (inputs, targets), the same for every variant timed."""
    gen = torch.Generator().manual_seed(0)
    size = (params.train.batch_size, params.model.block_size)
    return torch.randint(0, VOCAB, size, generator=gen), torch.randint(0, VOCAB, size, generator=gen)


def interleaved_rates(runners: dict, inputs: torch.Tensor, targets: torch.Tensor, steps: int,
                      rounds: int) -> dict[str, list[float]]:
    """tokens/s of each runner (a step function of inputs, targets), `steps` steps per round, the runners taking
    turns for `rounds` rounds (so a machine that slows down slows them all)."""
    rates = {name: [] for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            started = time.perf_counter()
            for _ in range(steps):
                runner(inputs, targets)
            rates[name].append(steps * inputs.numel() / (time.perf_counter() - started))
    return rates


def shape_rates(shape: str, params, rates: dict[str, list[float]], before: str) -> dict:
    """A shape's medians and their ratios to the `before` variant, with the rounds."""
    base = statistics.median(rates[before])
    return {"shape": shape, "optimizer": params.train.optimizer, "model": params.model.model_dump(),
            "batch": [params.train.batch_size, params.model.block_size],
            "tokens_per_s": {m: statistics.median(r) for m, r in rates.items()},
            "ratio_to_before": {m: statistics.median(r) / base for m, r in rates.items()}, "rounds": rates}


def run_shapes(measure, args, prefix: str) -> None:
    """Both budget shapes through measure(shape, overrides, steps, rounds, scratch) (--smoke: the small one, made
    tiny, one round of one step), printed, and written to --out with the machine's label."""
    scratch = Path(tempfile.mkdtemp(prefix=prefix))
    overrides, shapes = [], ("small", "production")
    if args.smoke:
        overrides = SMOKE_SHAPE
        args.steps, args.rounds, shapes = 1, 1, ("small",)
    results = [measure(shape, overrides, args.steps, args.rounds, scratch) for shape in shapes]
    for result in results:
        for name, rate in result["tokens_per_s"].items():
            print(f"{result['shape']:<11} {name:<46} {rate:>8,.0f} tokens/s ({result['ratio_to_before'][name]:.2f}x)")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_label(), "shapes": results}, indent=2))
        print(f"wrote {args.out}")


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
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
