"""Which modules really ran in training mode: forward pre-hooks on every module record its `.training` flag at the
moment it is called. The probe is attached from outside the code it watches, so a scoring or validation function
that switches the model to training mode (dropout on) is seen whatever that function says about itself."""

from __future__ import annotations

import torch.nn as nn


class ModeProbe:
    """with ModeProbe(model) as probe: ...  then probe.in_training names every module called in training mode."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.calls = 0
        self.in_training: list[str] = []
        self._handles = []

    def _hook_for(self, name: str):
        def hook(module, _inputs):
            self.calls += 1
            if module.training and name not in self.in_training:
                self.in_training.append(name)
        return hook

    def __enter__(self) -> "ModeProbe":
        self._handles = [module.register_forward_pre_hook(self._hook_for(name or "(model)"))
                         for name, module in self.model.named_modules()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def record(self) -> dict:
        shown = self.in_training[:8]
        return {"modules_called": self.calls, "in_training_mode": shown,
                "more": max(0, len(self.in_training) - len(shown))}
