"""Optimiser set-up: the weight-decay split and the learning-rate schedule."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


def build_param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: matrix-shaped weights (linear, embedding) decay; biases and LayerNorm parameters do not.

    Only trainable parameters are included, each in exactly one group.
    """
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_adamw(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    groups = [g for g in build_param_groups(model, weight_decay) if g["params"]]
    if not groups:
        raise ValueError("the model has no trainable parameters (all requires_grad=False)")
    # the fused kernel (one launch for all parameters) where every parameter is on a CUDA device
    fused = all(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused or None)


def cosine_with_warmup(step: int, warmup_steps: int, total_steps: int, max_lr: float, min_lr: float | None = None,
                       time_fraction: float = 0.0) -> float:
    """Linear warmup from 0 to max_lr over warmup_steps, then cosine decay to min_lr (default 10% of max_lr).

    time_fraction is the share of a wall-clock budget already spent: after warmup the decay follows whichever
    of step / total_steps and the clock is further along, so a time-limited run ends at min_lr either way.
    """
    if min_lr is None:
        min_lr = 0.1 * max_lr
    if warmup_steps > 0 and step < warmup_steps:
        return max_lr * step / warmup_steps
    progress = max((step - warmup_steps) / max(1, total_steps - warmup_steps), time_fraction)
    if progress >= 1.0:
        return min_lr
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
