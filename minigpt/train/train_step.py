"""One training step and its set-up (optimizer, LR schedule, precision), shared by the training loop and by
preflight's rehearsal, so that preflight proves the very step that training runs.

Callers reach these through the module (`train_step.training_step(...)`), never a copied reference, so a
change here (or a bug planted in a test) reaches both at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from minigpt.model import batch_loss
from minigpt.train import optim


def make_optimizer(model: nn.Module, train_cfg, lr: float | None = None, weight_decay: float | None = None):
    """The run's optimizer (train.optimizer: AdamW, or Muon + AdamW; decay split, betas); lr/weight_decay may be
    overridden (the overfit check's own LR)."""
    return optim.make_optimizer(model, train_cfg.optimizer, train_cfg.lr if lr is None else lr,
                                train_cfg.weight_decay if weight_decay is None else weight_decay, train_cfg.betas)


def scheduled_lr(train_cfg, step: int, time_fraction: float = 0.0, warmup_steps: int | None = None) -> float:
    """The run's LR at `step` (1-based): cosine_with_warmup over train.max_steps from train.lr to train.min_lr.
    warmup_steps may be shortened (preflight rehearses a warmup at most a few tens of steps long)."""
    warmup = train_cfg.warmup_steps if warmup_steps is None else warmup_steps
    return optim.cosine_with_warmup(step, warmup, train_cfg.max_steps, train_cfg.lr, train_cfg.min_lr, time_fraction)


@dataclass(frozen=True)
class StepResult:
    loss: float
    grad_norm: float  # before clipping
    lr: float  # what the optimizer applied
    stepped: bool  # False when the loss or gradient norm was non-finite: the weights were left untouched


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
                  lr: float, precision: str, grad_clip: float, clip_params=None) -> StepResult:
    """lr into every group -> forward in the run's precision -> loss -> zero_grad, backward -> clip -> step.

    The optimizer does not step on a non-finite loss or gradient norm; the gradients are left in place, so the
    caller can say where they went non-finite. clip_params: the parameters to clip (the unwrapped model's under
    DDP / torch.compile; default: model.parameters()).
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = batch_loss.calc_loss_batch(model, inputs, targets, precision)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(list(model.parameters()) if clip_params is None else clip_params,
                                                     grad_clip))
    loss_value = float(loss.detach())
    finite = math.isfinite(loss_value) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    return StepResult(loss_value, grad_norm, optimizer.param_groups[0]["lr"], finite)
