"""What preflight's checks (and the doctor's) share: the inputs, the artifacts they load, and what earlier checks
produced, in one object passed from check to check."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from minigpt.core.config import Params
from minigpt.data.soft_target_files import SoftTargets
from minigpt.data.tokenizer_files import Tokenizer
from minigpt.model.gpt import MiniGPT, MiniGPTConfig
from minigpt.train import distill


@dataclass
class Context:
    """What the checks share: inputs, the artifacts they load, and what earlier checks produced."""

    params: Params
    root: Path
    device: torch.device
    model_config: MiniGPTConfig | None = None
    model_factory: Callable[[MiniGPTConfig], nn.Module] = MiniGPT
    # filled by the checks
    tokenizer: Tokenizer | None = None
    meta: dict | None = None
    splits: dict[str, torch.Tensor] = field(default_factory=dict)
    batch: tuple[torch.Tensor, torch.Tensor] | None = None
    soft_targets: SoftTargets | None = None  # params.uses_soft_targets(): what the run trains towards or mixes in
    model: nn.Module | None = None
    rehearsal: dict | None = None
    summary: dict = field(default_factory=dict)

    def path(self, relative: Path) -> Path:
        return self.root / relative

    def generator(self, offset: int = 0) -> torch.Generator:
        return torch.Generator().manual_seed(self.params.preflight.seed + offset)

    def batch_with_prior(self) -> tuple:
        """(inputs, targets, prior): the check batch and the n-gram the model mixes in at its targets under
        model.ngram_expert (the same windows, drawn with their starts), else ctx.batch and None."""
        if not self.model_config.ngram_expert:
            return (*self.batch, None)
        if self.soft_targets is None:
            raise ValueError("model.ngram_expert: the soft targets (the n-gram mixed in) were not loaded")
        inputs = self.batch[0]
        return distill.draw_batch(self.splits["train"], inputs.shape[0], inputs.shape[1], self.device,
                                  self.generator(1), self.soft_targets)

    def seed_all(self, offset: int = 0) -> None:
        torch.manual_seed(self.params.preflight.seed + offset)
