"""Static full-split scoring: every target token scored exactly once, with at least block_size - stride tokens
of context (sliding windows), batched, no grad, eval mode."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from minigpt.model.devices import autocast_for


def window_plan(num_tokens: int, block_size: int, stride: int) -> list[tuple[int, int]]:
    """(start, first scored offset) per window over targets 1..num_tokens-1.

    Window k feeds ids[s:s+T] and predicts ids[s+1:s+T+1]; it scores only the targets no earlier window scored.
    After the first window every scored target sits at offset >= T - stride, i.e. has >= T - stride + 1 tokens
    of context; the last window is aligned to the end of the split.
    """
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be in [1, block_size={block_size}], got {stride}")
    if num_tokens < 2:
        return []
    window = min(block_size, num_tokens - 1)
    last_start = num_tokens - 1 - window
    starts = list(range(0, last_start + 1, stride))
    if starts[-1] != last_start:
        starts.append(last_start)
    plan, scored_upto = [], 0  # targets t <= scored_upto are already scored (t counts from 1)
    for start in starts:
        plan.append((start, max(scored_upto - start, 0)))
        scored_upto = start + window
    return plan


def window_batch(ids: torch.Tensor, windows: list[tuple[int, int]], width: int, device: torch.device):
    """(inputs, targets, mask), each [len(windows), width], for windows (start, first scored offset) of the
    plan: mask marks the targets each window scores."""
    offsets = torch.arange(width)
    index = torch.tensor([start for start, _ in windows])[:, None] + offsets
    first = torch.tensor([offset for _, offset in windows])
    return ids[index].to(device), ids[index + 1].to(device), (offsets[None, :] >= first[:, None]).to(device)


def window_nll(model, inputs: torch.Tensor, targets: torch.Tensor, precision: str, prior=None) -> torch.Tensor:
    """Per-target NLL [B, T] in fp32 of a forward pass in the given precision (prior: the n-gram at the targets,
    model.ngram_expert)."""
    with autocast_for(inputs.device, precision):
        logits, _ = model(inputs) if prior is None else model(inputs, prior=prior)
    nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
    return nll.view(targets.shape)


@torch.inference_mode()  # no autograd bookkeeping at all (cheaper than no_grad)
def target_nll(model, ids: np.ndarray | torch.Tensor, stride: int, batch_size: int, device: torch.device,
               precision: str = "fp32", priors=None) -> np.ndarray:
    """The NLL (nats) of every target 1..len-1 of the split, in target order, each scored exactly once. priors
    (required under model.ngram_expert): the split's n-gram priors (minigpt.data.soft_target_files.Priors)."""
    if (priors is None) == bool(getattr(model.config, "ngram_expert", False)):
        raise ValueError("scoring a model.ngram_expert model needs the split's n-gram priors, and only such a model")
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    block = model.config.block_size
    plan = window_plan(len(ids), block, stride)
    window = min(block, len(ids) - 1)
    out = np.full(max(len(ids) - 1, 0), np.nan)
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(plan), batch_size):
            windows = plan[i:i + batch_size]
            inputs, targets, mask = window_batch(ids, windows, window, device)
            starts = torch.tensor([start for start, _ in windows])
            prior = None if priors is None else priors.for_targets(starts, window, device)
            nll = (window_nll(model, inputs, targets, precision) if prior is None
                   else window_nll(model, inputs, targets, precision, prior))
            # target index (0-based over targets 1..len-1) of window position j is start + j
            position = torch.tensor([start for start, _ in windows])[:, None] + torch.arange(window)
            out[position[mask.cpu()].numpy()] = nll[mask].double().cpu().numpy()
    finally:
        model.train(was_training)
    if np.isnan(out).any():  # the window plan covers every target; this guards the plan itself
        raise RuntimeError(f"{int(np.isnan(out).sum())} targets were not scored by the window plan")
    return out


def summarise(nll: np.ndarray, chars: np.ndarray | None = None) -> dict:
    """Mean NLL per target token (nats) and its perplexity, and bits per character: the summed NLL in bits over
    the characters the targets hold (`chars`, per target; one each for a character tokenizer)."""
    loss = float(nll.sum()) / len(nll)
    characters = len(nll) if chars is None else int(np.sum(chars))
    return {"loss": loss, "perplexity": math.exp(loss), "bpc": float(nll.sum()) / characters / math.log(2),
            "tokens": int(len(nll)), "characters": characters}


def target_chars(ids, char_counts: np.ndarray) -> np.ndarray:
    """The characters each target 1..len-1 holds (`char_counts` per ID: the tokenizer's char_counts())."""
    return char_counts[np.asarray(ids, dtype=np.int64)[1:]]


def score_split(model, ids: np.ndarray | torch.Tensor, stride: int, batch_size: int, device: torch.device,
                precision: str = "fp32", char_counts: np.ndarray | None = None, priors=None) -> dict:
    """Mean NLL over every target of the split, with perplexity and bits per character."""
    chars = None if char_counts is None else target_chars(ids, char_counts)
    return summarise(target_nll(model, ids, stride, batch_size, device, precision, priors), chars)
