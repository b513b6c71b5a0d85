"""Training towards soft targets as well as the one-hot ones (train.distill_alpha > 0):

    loss = (1 - a) CE(model, next token) + a CE(model, the n-gram's distribution of the next token)

where the n-gram's distribution is the cross-fitted one of stage soft_targets (minigpt.data.soft_targets): it was
counted without the position's fold, so it teaches what counting train's n-grams knows about the context, never the
position's own continuation. The step reports and the watchdogs judge the one-hot CE alone, the loss val measures.

draw_batch is the training loop's and preflight's rehearsal's one way to draw a batch: preflight's
soft_targets_aligned check proves on it that each target's soft target is the distribution of that target.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from minigpt.data import batching
from minigpt.data.soft_target_files import SoftTargets
from minigpt.model import devices

# (token IDs [B, T, top] long, their probabilities [B, T, top] float32, the mass outside them [B, T] float32): also
# the prior model.ngram_expert mixes in (minigpt.model.ngram_expert.Prior)
Soft = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def draw_batch(data: torch.Tensor, batch_size: int, block_size: int, device, generator,
               soft_targets: SoftTargets | None) -> tuple[torch.Tensor, torch.Tensor, Soft | None]:
    """(inputs, targets, soft): get_batch's windows and, with soft targets, those of the windows' targets."""
    if soft_targets is None:
        return (*batching.get_batch(data, batch_size, block_size, device, generator), None)
    inputs, targets, starts = batching.get_batch(data, batch_size, block_size, device, generator, with_starts=True)
    return inputs, targets, soft_targets.for_targets(starts, block_size, device)


def soft_cross_entropy(logits: torch.Tensor, soft: Soft) -> torch.Tensor:
    """Mean over positions of -sum_j p_j log q(id_j), q the model's softmax (in fp32), (id, p) the soft target."""
    ids, probs = soft[0], soft[1]
    log_q = F.log_softmax(logits.float(), dim=-1).gather(-1, ids)
    return -(probs * log_q).sum(-1).mean()


def distilled_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, soft: Soft, alpha: float,
                   precision: str, prior: Soft | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the objective to minimise, the one-hot CE alone) of one forward pass (mixed with `prior` under
    model.ngram_expert)."""
    with devices.autocast_for(inputs.device, precision):
        logits, loss = model(inputs, targets) if prior is None else model(inputs, targets, prior=prior)
    return (1 - alpha) * loss + alpha * soft_cross_entropy(logits, soft), loss
