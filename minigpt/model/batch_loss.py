"""The loss of a batch and of a fixed set of validation batches: what training logs at every probe, what
preflight's rehearsal measures, and what the doctor compares against log(vocab_size)."""

from __future__ import annotations

import torch
import torch.nn as nn

from minigpt.data import batching
from minigpt.model import devices
from minigpt.model.ngram_expert import prior_log_probs


def calc_loss_batch(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                    precision: str = "fp32", prior=None) -> torch.Tensor:
    """The batch's mean cross-entropy; prior: the n-gram's distribution at its targets (model.ngram_expert)."""
    with devices.autocast_for(inputs.device, precision):
        # a model without the option (and a test's stand-in) is called as before
        _, loss = model(inputs, targets) if prior is None else model(inputs, targets, prior=prior)
    return loss


@torch.no_grad()
def evaluate_model(model: nn.Module, batches, precision: str = "fp32") -> float:
    """Mean loss over fixed batches (inputs, targets[, prior]) in eval mode (no dropout), the model's train/eval
    mode restored after."""
    was_training = model.training
    model.eval()
    try:
        losses = [float(calc_loss_batch(model, x, y, precision, *prior)) for x, y, *prior in batches]
    finally:
        model.train(was_training)
    return sum(losses) / len(losses)


def prior_loss(batches, vocab_size: int) -> float:
    """The mean loss of the n-gram alone (model.ngram_expert's prior) on batches (inputs, targets, prior)."""
    losses = [-prior_log_probs(prior, vocab_size).gather(-1, targets[..., None]).mean()
              for _inputs, targets, prior in batches]
    return float(torch.stack(losses).mean())


def fixed_val_batches(val: torch.Tensor, count: int, batch_size: int, block_size: int, seed: int,
                      device: torch.device, priors=None) -> list[tuple]:
    """The validation batches, sliced once from their own seed: identical at every probe and every run; with
    `priors` (val's n-gram priors, model.ngram_expert) each batch carries its targets' prior third."""
    gen = torch.Generator().manual_seed(seed + 1_000_003)
    if priors is None:
        return [batching.get_batch(val, batch_size, block_size, device, gen) for _ in range(count)]
    batches = []
    for _ in range(count):
        inputs, targets, starts = batching.get_batch(val, batch_size, block_size, device, gen, with_starts=True)
        batches.append((inputs, targets, priors.for_targets(starts, block_size, device)))
    return batches
