"""Training throughput (tokens/s) of a model preset, fp32 vs bf16 autocast, measured side by side.

    python benchmarks/train_throughput.py [--model production] [--batch 32] [--steps 10] [--rounds 3]

Rounds alternate the precisions so that machine noise hits both alike; the table reports medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from bench_common import machine_label, model_preset
from minigpt.model.gpt import MiniGPT
from minigpt.train import train_step
from minigpt.train.optim import make_adamw


def time_steps(model, optimizer, batch, precision: str, steps: int) -> float:
    inputs, targets = batch
    start = time.perf_counter()
    for _ in range(steps):
        train_step.training_step(model, optimizer, inputs, targets, 1e-3, precision, 1.0)  # the project's step
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="production")
    parser.add_argument("--vocab", type=int, default=119, help="vocabulary size (wt2-mini: 119)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    config = model_preset(args.model, args.vocab)
    torch.manual_seed(0)
    batch = (torch.randint(0, args.vocab, (args.batch, config.block_size)),
             torch.randint(0, args.vocab, (args.batch, config.block_size)))
    precisions = args.precisions.split(",")
    runs = {}
    for precision in precisions:
        model = MiniGPT(config).train()
        optimizer = make_adamw(model, 1e-3, 0.1)
        time_steps(model, optimizer, batch, precision, 2)  # warm-up
        runs[precision] = (model, optimizer)
    samples = {p: [] for p in precisions}
    for _ in range(args.rounds):
        for precision, (model, optimizer) in runs.items():
            seconds = time_steps(model, optimizer, batch, precision, args.steps)
            samples[precision].append(args.batch * config.block_size * args.steps / seconds)
    params = MiniGPT(config).num_parameters()
    result = {"machine": machine_label(), "model": args.model, "parameters": params, "batch": args.batch,
              "block_size": config.block_size,
              "threads": torch.get_num_threads(),
              "tokens_per_sec": {p: statistics.median(v) for p, v in samples.items()}}
    print(f"model {args.model}: {params:,} parameters, batch {args.batch} x {config.block_size}, {result['threads']} "
          "threads")
    base = result["tokens_per_sec"][precisions[0]]
    for p in precisions:
        rate = result["tokens_per_sec"][p]
        print(f"  {p:<5} {rate:>10,.0f} tokens/s  ({rate / base:.2f}x {precisions[0]})  samples "
              f"{[round(v) for v in samples[p]]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
