"""One training step with its optimizer and LR schedule, shared by the training loop and preflight's rehearsal,
so that preflight proves the very step that training runs.

`train.lr` reaches the optimizer here and nowhere else: ScheduledStep builds the run's optimizer, computes the LR
of each step from the schedule (cosine_with_warmup over train.max_steps, or over the clock under
train.max_seconds) and writes it into every group before the step. Its callers pass a step number and the clock,
never an LR. training_step is the bare step for the checks that need one LR of their own (the overfit check, the
clipping contract, the timing of precision: auto).

Callers reach these through the module (`train_step.ScheduledStep(...)`), never a copied reference, so a change
here (or a bug planted in a test) reaches both at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.profiler import record_function

from minigpt.model import batch_loss
from minigpt.train import distill, optim
from minigpt.train.muon import PHASE_NEWTON_SCHULZ

# the step's phases as torch.profiler ranges (each costs a few microseconds when no profiler runs): what
# benchmarks/profile_step.py splits a step into; Muon's orthogonalisation is a range inside "optimizer"
PHASES = {"forward": "minigpt.step.forward", "backward": "minigpt.step.backward", "clip": "minigpt.step.clip",
          "optimizer": "minigpt.step.optimizer", "newton_schulz": PHASE_NEWTON_SCHULZ}
NESTED_PHASES = {"newton_schulz": "optimizer"}  # a phase inside another -> the phase that holds it


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


def scheduled_lr(train_cfg, step: int, time_fraction: float = 0.0, warmup_steps: int | None = None) -> float:
    """The run's LR at `step` (1-based): cosine_with_warmup over train.max_steps from train.lr to train.min_lr.
    warmup_steps may be shortened (preflight rehearses a warmup at most a few tens of steps long)."""
    warmup = train_cfg.warmup_steps if warmup_steps is None else warmup_steps
    return cosine_with_warmup(step, warmup, train_cfg.max_steps, train_cfg.lr, train_cfg.min_lr, time_fraction)


def make_optimizer(model: nn.Module, train_cfg, lr: float | None = None, weight_decay: float | None = None):
    """The run's optimizer (train.optimizer: AdamW, or Muon + AdamW; decay split, betas). Its groups start at lr,
    by default the schedule's first step's LR (the value the first step applies); weight_decay may be overridden
    (the overfit check's own)."""
    return optim.make_optimizer(model, train_cfg.optimizer, scheduled_lr(train_cfg, 1) if lr is None else lr,
                                train_cfg.weight_decay if weight_decay is None else weight_decay, train_cfg.betas)


@dataclass(frozen=True)
class StepResult:
    loss: float
    grad_norm: float  # before clipping
    lr: float  # what the optimizer applied (its first group's LR)
    stepped: bool  # False when the loss or gradient norm was non-finite: the weights were left untouched
    scheduled_lr: float | None = None  # what the schedule said (ScheduledStep), for the lr_applied watchdog


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
                  lr: float, precision: str, grad_clip: float, clip_params=None, soft: distill.Soft | None = None,
                  distill_alpha: float = 0.0, prior: distill.Soft | None = None) -> StepResult:
    """lr into every group -> forward in the run's precision -> loss -> zero_grad, backward -> clip -> step.

    The optimizer does not step on a non-finite loss or gradient norm; the gradients are left in place, so the
    caller can say where they went non-finite. clip_params: the parameters to clip (the unwrapped model's under
    DDP / torch.compile; default: model.parameters()). soft: the batch's soft targets, mixed into the objective with
    weight distill_alpha (minigpt.train.distill); the result's loss is the one-hot CE either way. prior: the n-gram
    mixed into the output (model.ngram_expert), the soft targets themselves.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    with record_function(PHASES["forward"]):
        if soft is None or distill_alpha == 0:
            loss = objective = batch_loss.calc_loss_batch(model, inputs, targets, precision, prior)
        else:
            objective, loss = distill.distilled_loss(model, inputs, targets, soft, distill_alpha, precision, prior)
    optimizer.zero_grad(set_to_none=True)
    with record_function(PHASES["backward"]):
        objective.backward()
    with record_function(PHASES["clip"]):
        grad_norm = float(torch.nn.utils.clip_grad_norm_(
            list(model.parameters()) if clip_params is None else clip_params, grad_clip))
    loss_value = float(loss.detach())
    finite = math.isfinite(loss_value) and math.isfinite(float(objective.detach())) and math.isfinite(grad_norm)
    if finite:
        optim.orthogonalise_in(optimizer, precision)
        with record_function(PHASES["optimizer"]):
            optimizer.step()
    return StepResult(loss_value, grad_norm, optimizer.param_groups[0]["lr"], finite)


class ScheduledStep:
    """The run's optimizer and LR schedule, and the step that applies them: step `n` at clock fraction `f` trains
    at scheduled_lr(train, n, f). `model` is the plain MiniGPT (its parameters are optimised and clipped);
    run_through() makes a wrapper of it (torch.compile, DDP) run the forward."""

    def __init__(self, model: nn.Module, train_cfg, warmup_steps: int | None = None):
        self.train_cfg = train_cfg
        self.warmup_steps = warmup_steps
        self.model = model
        self.forward_model = model
        # model.ngram_expert: every step's output is mixed with the batch's soft targets (its cross-fitted n-gram)
        self.expert = bool(getattr(getattr(model, "config", None), "ngram_expert", False))
        self.optimizer = make_optimizer(model, train_cfg, lr=self.lr_at(1))

    def run_through(self, wrapper: nn.Module) -> None:
        self.forward_model = wrapper

    def lr_at(self, step: int, time_fraction: float = 0.0) -> float:
        return scheduled_lr(self.train_cfg, step, time_fraction, self.warmup_steps)

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor, step: int,
                 time_fraction: float = 0.0, soft: distill.Soft | None = None) -> StepResult:
        lr = self.lr_at(step, time_fraction)
        cfg = self.train_cfg
        distilled = {} if soft is None else {"soft": soft, "distill_alpha": cfg.distill_alpha}
        if self.expert:
            if soft is None:
                raise ValueError("model.ngram_expert: the step needs the batch's soft targets (its prior)")
            distilled["prior"] = soft
        result = training_step(self.forward_model, self.optimizer, inputs, targets, lr, cfg.precision, cfg.grad_clip,
                               self.model.parameters(), **distilled)
        return StepResult(result.loss, result.grad_norm, result.lr, result.stepped, scheduled_lr=lr)
