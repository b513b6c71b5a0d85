"""Dropout whose mask is cheap to draw on a CPU.

torch's CPU dropout draws one random number per element from the Mersenne Twister, which costs far more than
applying the mask (docs/decisions.md, "minigpt's own dropout masks on a CPU"). Here a
CPU mask comes from 64-bit draws cut into four 16-bit integers (a quarter of the generator calls): an element is
dropped when its integer falls below round(p * 65536), so with probability p to within 2^-17, and the kept ones are
scaled by 1 / (1 - that probability), which keeps every activation's expectation exactly. Other devices use
torch's own dropout (fast there). Both draw from torch's generator: torch.manual_seed reproduces the masks.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

LEVELS = 1 << 16  # 16-bit integers: four per 64-bit draw
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def dropped_levels(p: float) -> int:
    """How many of the 2^16 integer values drop an element: p * 2^16 rounded (at most 2^16 - 1: p < 1 keeps some)."""
    return min(round(p * LEVELS), LEVELS - 1)


def drop_probability(p: float) -> float:
    """The probability an element is actually dropped on a CPU: p rounded to a multiple of 2^-16."""
    return dropped_levels(p) / LEVELS


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A bool CPU tensor of `shape`, each element False with probability drop_probability(p), independently."""
    count = shape.numel()
    # random_(from, to) draws uniformly from [from, to): the whole int64 range but its largest value (a 2^-64 bias)
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(INT64_MIN, INT64_MAX)
    halves = words.view(torch.int16)[:count].view(shape)  # uniform on [-32768, 32767]
    return halves >= dropped_levels(p) - LEVELS // 2


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    # autograd keeps the mask for the backward pass, as F.dropout does. The scale stays a Python float: torch
    # multiplies a bf16 tensor by it in fp32 and rounds once (a bf16 scale, 1.109375 for 1/0.9, would bias every
    # kept value by -0.16%)
    return x * keep_mask(x.shape, p) * (1.0 / (1.0 - drop_probability(p)))


class Dropout(nn.Module):
    """nn.Dropout's interface (p, train/eval) with the cheap CPU mask above."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
