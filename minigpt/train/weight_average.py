"""An exponential moving average of the trained weights (train.ema_decay): what the run evaluates, keeps as its best
checkpoint and samples from, while the optimizer goes on stepping the trained weights.

After update n (counted from 1) every parameter and floating buffer of the average is
    average = d_n * average + (1 - d_n) * trained,   d_n = min(decay, n / (n + 9)),
so the first update takes 90% of the trained weights (d_1 = 0.1: a fixed decay from the random initialisation would
make the first evaluations score a mostly untrained model), the memory then grows with the run (about n / 9 steps
after n updates) up to its full length, about 1 / (1 - decay) steps.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn


def floating_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """name -> every floating parameter and buffer of the model: what the average keeps."""
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    return {n: t for n, t in tensors.items() if t.is_floating_point()}


def decay_at(decay: float, update: int) -> float:
    """The weight the average keeps at its `update`-th update (1-based)."""
    return min(decay, update / (update + 9))


class WeightAverage:
    def __init__(self, trained: nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        # its own tensors: an average that shared storage with the trained weights would just be them
        self.model = copy.deepcopy(trained).eval()
        self.model.requires_grad_(False)
        self._pairs_of: nn.Module | None = None
        self._lists: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])

    def _pairs(self, trained: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The average's floating tensors and the trained model's, name by name (found once per trained model: its
        tensors are updated in place, so the lists stay valid)."""
        if self._pairs_of is not trained:
            mine, theirs = floating_tensors(self.model), floating_tensors(trained)
            self._pairs_of, self._lists = trained, (list(mine.values()), [theirs[n].detach() for n in mine])
        return self._lists

    @torch.no_grad()
    def update(self, trained: nn.Module) -> None:
        self.updates += 1
        weight = 1.0 - decay_at(self.decay, self.updates)
        averaged, current = self._pairs(trained)
        # averaged + weight * (current - averaged) = (1 - weight) * averaged + weight * current, one fused call for
        # every tensor (as torch.optim.swa_utils' EMA does): a Python loop of lerp_ cost 1.1% of a small-shape step
        torch._foreach_lerp_(averaged, current, weight)
