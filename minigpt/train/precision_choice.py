"""`train.precision: auto`: which precision runs a configuration's training step faster on this machine.

bf16 autocast is about twice as fast as fp32 on a CPU with AMX, and slower than fp32 on small models of a CPU
without it; the same preset cannot be right for both. So `make machine` (minigpt.train.machine_command) times a
few real training steps (the shared training step, the run's optimizer, the configured model and batch) in fp32
and in bf16, interleaved so that both see the same machine load (the rule of minigpt/model/precision.py), picks
the faster and writes it to conf/machine/. An explicit fp32 or bf16 is timed alone (a budget shape's speed).
"""

from __future__ import annotations

import time

import torch

from minigpt.core.config import Params
from minigpt.model import precision
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import train_step


def _time_training_steps(params: Params, vocab_size: int, device: torch.device,
                         precisions: tuple[str, ...]) -> tuple[dict[str, float], int, list[int]]:
    """Median seconds of one training step per precision (the run's step, optimizer, model and batch), the
    model's parameter count and the batch shape."""
    config = MiniGPTConfig.from_params(params.model, vocab_size)
    torch.manual_seed(0)
    model = MiniGPT(config).to(device)
    optimizer = train_step.make_optimizer(model, params.train)
    batch = [params.train.batch_size, config.block_size]
    inputs, targets = precision.random_batch(vocab_size, *batch, device, seed=0)
    mixed = {}
    if config.ngram_expert:  # the step mixes an n-gram in: timed with a random one of the soft targets' width
        gen = torch.Generator().manual_seed(0)
        top = min(params.soft_targets.top, vocab_size)
        probs = torch.rand(*batch, top, generator=gen)
        rest = torch.rand(*batch, generator=gen) / 10
        mixed["prior"] = (torch.randint(0, vocab_size, (*batch, top), generator=gen).to(device),
                          (probs / probs.sum(-1, keepdim=True)).to(device), rest.to(device))

    def step(kind: str) -> None:  # one training step in precision `kind`
        train_step.training_step(model, optimizer, inputs, targets, params.train.lr, kind, params.train.grad_clip,
                                 **mixed)

    return precision.interleaved_seconds(step, device, precisions), sum(p.numel() for p in model.parameters()), batch


def measure_training(params: Params, vocab_size: int, device: torch.device) -> dict:
    """How the run's precision is chosen, always timed (a fixed precision alone; under auto both, and the faster
    wins), plus the chosen precision's training tokens/s and the model's parameter count (what a budget shape is
    chosen by)."""
    started = time.perf_counter()
    fixed = precision.without_timing(params.train.precision, device)
    precisions = (fixed["choice"],) if fixed is not None else precision.PRECISIONS
    seconds, parameters, batch = _time_training_steps(params, vocab_size, device, precisions)
    spent = time.perf_counter() - started
    if fixed is None:
        record = precision.decide("auto", batch[0] * batch[1], seconds, spent, batch)
    else:
        record = {**fixed, "batch": batch, "timed_rounds": precision.TIMED_ROUNDS, "seconds": round(spent, 2)}
    record["tokens_per_s"] = round(batch[0] * batch[1] / seconds[record["choice"]], 1)
    record["parameters"] = parameters
    return record
