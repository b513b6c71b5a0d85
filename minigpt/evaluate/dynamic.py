"""Dynamic evaluation: the model keeps learning on a split while it scores it, as the adaptive compressors (PPMd,
xz) do. A separate, labelled figure: it never replaces or mixes with the static val/test bpc.

The split is cut into `streams` contiguous segments scored side by side. Each segment is read in the static
evaluation's sliding windows (minigpt.evaluate.scoring.window_plan: every target scored once, >= block_size - stride
tokens of context after a segment's first window); at each step every segment's next window is scored first
and only then does the model take one Adam step on the targets just scored. A target is therefore always
predicted by weights that have never seen it. Every split starts from the trained weights (a fresh copy).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from minigpt.evaluate.scoring import window_batch, window_nll, window_plan

LABEL = ("dynamic evaluation: the model learns on each split while scoring it (one Adam step per window, each "
         "target scored before any step on it); not comparable with the static bpc")


def segment_bounds(num_tokens: int, streams: int, block_size: int) -> list[tuple[int, int]]:
    """(first, last) token index of each segment: consecutive segments share one token, so the targets
    1 .. num_tokens - 1 are split among them exactly once (segment k predicts ids[first+1 .. last]). Fewer
    segments than asked when the split is short: each holds at least one full window (block_size targets)."""
    streams = max(1, min(streams, (num_tokens - 1) // block_size))
    edges = np.linspace(0, num_tokens - 1, streams + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def dynamic_score(model, ids: np.ndarray, stride: int, streams: int, lr: float, device: torch.device,
                  precision: str = "fp32", char_counts: np.ndarray | None = None, priors=None) -> dict:
    """Mean NLL over every target of the split under dynamic evaluation (the model passed in is not changed);
    bits per character over the characters the targets hold (`char_counts` per ID; one each when None).
    priors (required under model.ngram_expert): the split's n-gram priors, mixed in at every window."""
    if (priors is None) == bool(getattr(model.config, "ngram_expert", False)):
        raise ValueError("dynamic evaluation of a model.ngram_expert model needs the split's n-gram priors, and "
                         "only such a model")
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    learner = copy.deepcopy(model).to(device)
    learner.eval()  # no dropout: the steps adapt the weights, the forward pass stays the evaluation's
    optimizer = torch.optim.Adam(learner.parameters(), lr=lr, betas=(0.9, 0.99))
    block = learner.config.block_size
    bounds = segment_bounds(len(ids), streams, block)
    plans = [[(first + start, offset) for start, offset in window_plan(last - first + 1, block, stride)]
             for first, last in bounds]
    width = min(block, len(ids) - 1)  # every segment holds a full window (or the split is one short window)
    steps = max(len(p) for p in plans)
    total_nll, total_tokens, total_chars = 0.0, 0, 0
    for step in range(steps):
        windows = [p[step] for p in plans if step < len(p)]
        inputs, targets, mask = window_batch(ids, windows, width, device)
        prior = None if priors is None else priors.for_targets(torch.tensor([s for s, _ in windows]), width, device)
        new = window_nll(learner, inputs, targets, precision, prior)[mask]
        total_nll += float(new.detach().double().sum())  # scored before the step below
        total_tokens += int(mask.sum())
        total_chars += (int(mask.sum()) if char_counts is None else
                        int(char_counts[targets[mask].cpu().numpy()].sum()))
        optimizer.zero_grad(set_to_none=True)
        new.mean().backward()
        optimizer.step()
    loss = total_nll / total_tokens
    return {"loss": loss, "perplexity": math.exp(loss), "bpc": total_nll / total_chars / math.log(2),
            "tokens": total_tokens, "characters": total_chars,
            "steps": steps, "streams": len(bounds)}
