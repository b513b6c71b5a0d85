"""Rotary position embeddings: each head's query and key are rotated by an angle proportional to their position,
so their dot product depends on the positions only through their difference (no position table to learn).

The half-split convention: a head's width d is two halves (x1, x2) and pair i = (x1[i], x2[i]) turns by
position * base ** (-2i / d). The rotation acts on the last (head width) axis only: applied along any other
axis it would mix positions, and preflight's causal check would see the future leak in.
"""

from __future__ import annotations

import torch

ROTARY_BASE = 10_000.0


def rotary_tables(length: int, head_dim: int, base: float = ROTARY_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [length, head_dim // 2]: the angles of positions 0 .. length - 1."""
    inverse_frequency = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float64), inverse_frequency)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, T, d] rotated by the angles of its T positions (cos, sin: [T, d // 2])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)  # under bf16 autocast q and k are bf16: keep them so
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
