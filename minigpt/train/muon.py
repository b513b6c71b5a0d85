"""Muon with its Newton-Schulz orthogonalisation in the step's precision.

torch.optim.Muon always orthogonalises in bf16: fast on GPUs and on CPUs with bf16 matrix instructions (AMX,
AVX512_BF16), slow on a CPU without them, where torch emulates bf16. On a 2-core AMD EPYC with AVX2 only, a
1024x1024 bf16 matmul ran at 0.9 GFLOP/s against fp32's 122, orthogonalising one 128x512 update took 107 ms in
bf16 against 6.9 ms in fp32, and the budget shapes' fp32 training step ran 1.14x (small) and 1.16x (production)
faster with the orthogonalisation in fp32 (benchmarks/muon_precision.py). So a run that trains in fp32 (the
precision preflight picks where bf16 is the slower, or an explicit `train.precision=fp32`) orthogonalises in fp32
too, and a bf16 run exactly as torch does (op for op the same: bitwise the same update, tested)."""

from __future__ import annotations

import math

import torch

BF16 = "bf16"


def newton_schulz(update: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """The quintic Newton-Schulz iteration torch.optim.Muon uses (US'V^T with S' ~ 1 rather than UV^T exactly),
    computed in `dtype`: scaled to spectral norm <= 1, the wide orientation, `steps` rounds of X <- aX + (bA + cA^2)X
    with A = X X^T."""
    a, b, c = coefficients
    ortho = update.to(dtype)
    tall = update.size(0) > update.size(1)
    if tall:
        ortho = ortho.T
    ortho.div_(ortho.norm().clamp(min=eps))
    for _ in range(steps):
        gram = ortho @ ortho.T
        ortho = torch.addmm(ortho, torch.addmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a)
    return ortho.T if tall else ortho


class Muon(torch.optim.Muon):
    """torch.optim.Muon (its constructor, checks, groups and state: a checkpoint's optimizer state loads either
    way) whose step orthogonalises in `precision` ("bf16": torch's own; anything else: fp32). Only the
    "match_rms_adamw" LR adjustment (the update's RMS matched to AdamW's) is supported."""

    def __init__(self, params, **kwargs):
        if kwargs.get("adjust_lr_fn") != "match_rms_adamw":
            raise ValueError("minigpt's Muon scales its update with adjust_lr_fn='match_rms_adamw' only")
        super().__init__(params, **kwargs)
        self.precision = BF16

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("minigpt's Muon takes no closure")
        dtype = torch.bfloat16 if self.precision == BF16 else torch.float32
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                grad, state = param.grad, self.state[param]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
                buffer = state["momentum_buffer"]
                buffer.lerp_(grad, 1 - momentum)
                update = grad.lerp(buffer, momentum) if group["nesterov"] else buffer
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype)
                param.mul_(1 - lr * group["weight_decay"])  # decoupled weight decay
                # the update's RMS matched to AdamW's, with torch's rounding: lr * (0.2 * sqrt(max(rows, cols)))
                param.add_(update, alpha=-(lr * (0.2 * math.sqrt(max(param.shape[:2])))))
        return None
