"""Locate the first module whose forward output is non-finite, by its path in the model (e.g. blocks.1.attn)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


def _tensors(output):
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)


class NonFiniteTracker:
    """Context manager: forward hooks on every named submodule record the first non-finite output.

    Modules run in execution order, so the first hit is where NaN/Inf appears first. Hooks are removed on exit.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.first: str | None = None
        self._handles = []

    def __enter__(self) -> "NonFiniteTracker":
        for name, module in self.model.named_modules():
            if name:
                self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            floating = [t for t in _tensors(output) if t.is_floating_point()]
            if self.first is None and any(not torch.isfinite(t).all() for t in floating):
                self.first = name

        return hook

    def reset(self) -> None:
        self.first = None

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def first_non_finite_module(model: nn.Module, forward: Callable[[], object]) -> str | None:
    """Run `forward` once more without gradients under a tracker: the first module with a non-finite output, or None.
    Callers track only after a step failed (a step skipped on a non-finite loss leaves the weights as they were):
    hooks on every module at every step would cost more than the steps' own checks."""
    with NonFiniteTracker(model) as tracker, torch.no_grad():
        forward()
    return tracker.first
