"""Sampling: the next token under temperature, top-k, top-p (nucleus) and a repetition penalty, validated up front;
and text sampled from a model after a prompt, from its own seeded generator (the training loop's probe, the
generate stage and its CLI)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from minigpt.core.errors import ConfigError


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    # CTRL-style: logits of tokens already in the context window are divided (if > 0) or multiplied (if < 0)
    repetition_penalty: float = 1.0

    def validate(self, vocab_size: int, where: str = "generate") -> None:
        """where: a config section ('generate' -> 'generate.top_k') or a command-line prefix ('--' -> '--top-k')."""
        def name(key: str) -> str:
            return f"{where}{key.replace('_', '-')}" if where.endswith("-") else f"{where}.{key}"

        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ConfigError(f"'{name('temperature')}' = {self.temperature} is invalid; it must be a finite number > "
                              "0 (use a small value such as 0.1 for near-greedy).")
        if self.top_k is not None and not 1 <= self.top_k <= vocab_size:
            raise ConfigError(f"'{name('top_k')}' = {self.top_k} is invalid; it must be between 1 and the vocabulary "
                              f"size {vocab_size} (or null for no limit).")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"'{name('top_p')}' = {self.top_p} is invalid; it must be in (0, 1].")
        if not (self.repetition_penalty >= 1 and math.isfinite(self.repetition_penalty)):
            raise ConfigError(f"'{name('repetition_penalty')}' = {self.repetition_penalty} is invalid; it must be a "
                              "finite number >= 1 (1 disables it).")


def next_token_logits(logits: torch.Tensor, context: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Adjust last-position logits [B, V] given the context IDs [B, T]; returns logits with -inf for excluded IDs."""
    logits = logits.float()
    if settings.repetition_penalty != 1.0:
        seen = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, context, True)
        penalised = torch.where(logits > 0, logits / settings.repetition_penalty, logits * settings.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    logits = logits / settings.temperature
    if settings.top_k is not None and settings.top_k < logits.size(-1):
        kth = torch.topk(logits, settings.top_k).values[:, -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if settings.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already hold top_p of the mass (the top token always stays)
        drop_sorted = probs.cumsum(dim=-1) - probs >= settings.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


STREAM_CHUNK = 32  # the CLI prints as it samples, this many characters at a time


def sample_chunks(model, tokenizer, prompt: str, settings: SamplingSettings, max_new_tokens: int, seed: int,
                  device: torch.device, chunk: int = STREAM_CHUNK, prior_of=None):
    """Yield the sampled text piece by piece (every `chunk` characters) from one sampling stream, so the pieces
    join to exactly what one call samples. prior_of: the n-gram mixed in under model.ngram_expert."""
    ids = torch.as_tensor(tokenizer.encode(prompt), dtype=torch.long, device=device)[None, :]
    generator = torch.Generator(device=device).manual_seed(seed)
    pending: list[int] = []
    for next_id in model.generate_stream(ids, max_new_tokens, settings, generator, prior_of):
        pending.append(int(next_id[0, 0]))
        if len(pending) == chunk:
            yield tokenizer.decode(pending)
            pending = []
    if pending:
        yield tokenizer.decode(pending)


def sample_text(model, tokenizer, prompt: str, settings: SamplingSettings, max_new_tokens: int, seed: int,
                device: torch.device, prior_of=None) -> str:
    return "".join(sample_chunks(model, tokenizer, prompt, settings, max_new_tokens, seed, device,
                                 chunk=max(1, max_new_tokens), prior_of=prior_of))
