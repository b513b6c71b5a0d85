"""Muon with its Newton-Schulz orthogonalisation in the step's precision, the matrices of one shape together.

torch.optim.Muon always orthogonalises in bf16: fast on GPUs and on CPUs with bf16 matrix instructions (AMX,
AVX512_BF16), slow on a CPU without them, where torch emulates bf16. So a run that trains in fp32 (the precision
`make machine` picks where bf16 is the slower, or an explicit `train.precision=fp32`) orthogonalises in fp32 too,
and a bf16 run in bf16.

In either precision the matrices of one shape (the same layer of every block) are orthogonalised together, as one
batch of matrix products, instead of one matrix at a time as torch does: a 128-wide product is too small to keep two
cores busy, and each call costs about as much as its arithmetic. Each matrix's result is its own iteration's, up to
rounding (tested); with by_shape off, a bf16 step is torch's update bit for bit (tested). The measurements:
docs/decisions.md, "Muon's orthogonalisation in the step's precision, batched by shape"."""

from __future__ import annotations

import math

import torch
from torch.profiler import record_function

BF16 = "bf16"
PHASE_NEWTON_SCHULZ = "minigpt.step.newton_schulz"  # the torch.profiler range of a step's orthogonalisation


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz iteration torch.optim.Muon uses (US'V^T with S' ~ 1 rather than UV^T exactly),
    computed in `dtype`: scaled to spectral norm <= 1, the wide orientation, `steps` rounds of X <- aX + (bA + cA^2)X
    with A = X X^T."""
    a, b, c = coefficients
    ortho = update.to(dtype)
    tall = update.size(-2) > update.size(-1)
    if tall:
        ortho = ortho.mT
    if ortho.dim() == 2:  # torch's own ops, so that one bf16 matrix gets torch's update bit for bit
        ortho = ortho / ortho.norm().clamp(min=eps)  # not in place: in fp32 `ortho` may be the caller's tensor
        for _ in range(steps):
            gram = ortho @ ortho.T
            ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    else:  # a stack of matrices (k, rows, cols): each scaled by its own norm, the same rounds as batched products
        ortho = ortho / ortho.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = ortho @ ortho.mT
            ortho = torch.baddbmm(ortho, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    return ortho.mT if tall else ortho


def orthogonalised(updates: list[torch.Tensor], coefficients: tuple[float, float, float], steps: int, eps: float,
                   dtype: torch.dtype, by_shape: bool = True) -> list[torch.Tensor]:
    """newton_schulz of each update: with by_shape, the updates of one shape stacked and orthogonalised as one batch;
    without, one matrix at a time (in bf16 torch's own order of operations)."""
    if not by_shape:
        return [newton_schulz(u, coefficients, steps, eps, dtype) for u in updates]
    same_shape: dict[torch.Size, list[int]] = {}  # each shape's positions in `updates`
    for index, update in enumerate(updates):
        same_shape.setdefault(update.shape, []).append(index)
    results: list[torch.Tensor | None] = [None] * len(updates)
    for indices in same_shape.values():
        if len(indices) == 1:
            results[indices[0]] = newton_schulz(updates[indices[0]], coefficients, steps, eps, dtype)
            continue
        stacked = newton_schulz(torch.stack([updates[i] for i in indices]), coefficients, steps, eps, dtype)
        for i, ortho in zip(indices, stacked.unbind(0)):
            results[i] = ortho
    return results


class Muon(torch.optim.Muon):
    """torch.optim.Muon (its constructor, checks, groups and state: a checkpoint's optimizer state loads either
    way) whose step orthogonalises in `precision` ("bf16", anything else: fp32), the matrices of one shape together
    unless `by_shape` is False (then in bf16 torch's own update). Only the "match_rms_adamw" LR adjustment (the
    update's RMS matched to AdamW's) is supported."""

    def __init__(self, params, **kwargs):
        if kwargs.get("adjust_lr_fn") != "match_rms_adamw":
            raise ValueError("minigpt's Muon scales its update with adjust_lr_fn='match_rms_adamw' only")
        super().__init__(params, **kwargs)
        self.precision = BF16
        self.by_shape = True

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("minigpt's Muon takes no closure")
        dtype = torch.bfloat16 if self.precision == BF16 else torch.float32
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            params, updates = [], []
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad, state = param.grad, self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                params.append(param)
                updates.append(grad.lerp(buffer, momentum) if group["nesterov"] else buffer)
            with record_function(PHASE_NEWTON_SCHULZ):
                updates = orthogonalised(updates, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype,
                                         self.by_shape)
            for param, update in zip(params, updates):
                param.mul_(1 - lr * group["weight_decay"])  # decoupled weight decay
                # the update's RMS matched to AdamW's, with torch's rounding: lr * (0.2 * sqrt(max(rows, cols)))
                param.add_(update, alpha=-(lr * (0.2 * math.sqrt(max(param.shape[:2])))))
        return None
