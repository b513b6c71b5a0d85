"""Training batches: random windows of block_size + 1 tokens, targets shifted by one."""

from __future__ import annotations

import torch


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    block_size: int,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
    with_starts: bool = False,
):
    """(inputs, targets), each [batch_size, block_size] long on `device`; targets[:, t] = inputs[:, t + 1].
    with_starts: also the windows' first positions in data ([batch_size], on the CPU), so that what belongs to a
    position (its soft target) can be looked up: targets[:, t] is data[starts + t + 1]."""
    if data.numel() < block_size + 1:
        raise ValueError(f"split has {data.numel()} tokens; a window needs block_size + 1 = {block_size + 1}")
    starts = torch.randint(0, data.numel() - block_size, (batch_size,), generator=generator)
    windows = data[starts[:, None] + torch.arange(block_size + 1)]
    inputs, targets = windows[:, :-1], windows[:, 1:]
    batch = inputs.to(device, dtype=torch.long), targets.to(device, dtype=torch.long)
    return (*batch, starts) if with_starts else batch
