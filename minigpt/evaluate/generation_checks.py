"""The guide's "during generation" checklist, recorded by the generate stage (generation.json "checks"): the best
checkpoint and its tokenizer, evaluation mode while sampling (a ModeProbe attached from outside the sampler), every
forward pass within block_size positions counting the KV cache (a forward pre-hook on the model), temperature > 0,
top_k within the vocabulary when set, and repetition measured on every sample. A failed item stops the stage with
its name; nothing is written."""

from __future__ import annotations

import torch.nn as nn

from minigpt.core.errors import MinigptError
from minigpt.model.mode_probe import ModeProbe

GENERATION_CHECKS = ("best_checkpoint", "matching_tokenizer", "eval_mode", "context_within_block",
                     "temperature_positive", "top_k_within_vocab", "repetition_measured")


class GenerationCheckFailed(MinigptError):
    """Sampling broke one of the guide's generation rules: no samples are reported."""


class ContextProbe:
    """Every forward call's positions (its input's length plus what the KV cache already holds) against the block;
    raises at the first call past it, before the model runs it."""

    def __init__(self, model: nn.Module, block_size: int):
        self.model, self.block_size, self.most, self.calls = model, block_size, 0, 0
        self._handle = None

    def _hook(self, _module, args, kwargs):
        cache = kwargs.get("cache")
        positions = args[0].shape[1] + (cache.length if cache is not None else 0)
        self.calls += 1
        self.most = max(self.most, positions)
        if positions > self.block_size:
            raise GenerationCheckFailed(
                f"context_within_block: a sampling forward pass saw {positions} positions, more than block_size "
                f"{self.block_size}: the context must be cropped to the last block_size tokens")

    def __enter__(self) -> "ContextProbe":
        self._handle = self.model.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def generation_checks(settings, vocab_size: int, checkpoint_is_best: bool, fingerprints: tuple[str, str],
                      mode: ModeProbe, context: ContextProbe, samples: list[dict], where: str) -> dict:
    """Each item with what it saw; raises GenerationCheckFailed naming every item that failed."""
    checks = {
        "best_checkpoint": {"passed": checkpoint_is_best},
        "matching_tokenizer": {"passed": fingerprints[0] == fingerprints[1], "checkpoint": fingerprints[0][:16],
                               "tokenizer": fingerprints[1][:16]},
        "eval_mode": {"passed": not mode.in_training, **mode.record()},
        "context_within_block": {"passed": context.most <= context.block_size, "most_positions": context.most,
                                 "block_size": context.block_size, "forward_calls": context.calls},
        "temperature_positive": {"passed": settings.temperature > 0, "temperature": settings.temperature},
        "top_k_within_vocab": {"passed": settings.top_k is None or 1 <= settings.top_k <= vocab_size,
                               "top_k": settings.top_k, "vocab_size": vocab_size},
        "repetition_measured": {"passed": bool(samples) and all("repeated_4gram_share" in s for s in samples)},
    }
    failed = [name for name, check in checks.items() if not check["passed"]]
    if failed:
        raise GenerationCheckFailed(f"{where}: generation check(s) failed: {', '.join(failed)} "
                                    f"({'; '.join(f'{n}: {checks[n]}' for n in failed)}); no samples reported.")
    return checks
