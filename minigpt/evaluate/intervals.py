"""How sure a bits-per-character figure is: a bootstrap over contiguous blocks of the scored targets.

A split's targets are cut into contiguous blocks (their summed NLL and token counts are what evaluate keeps). The
bpc of a resample is sum(NLL) / sum(tokens) / ln 2 over blocks drawn with replacement; the 95% interval is the
2.5th and 97.5th percentile over the resamples. Blocks rather than single characters, because neighbouring
characters' losses are correlated (a hard word is hard for several characters): resampling blocks keeps that
correlation inside each block, so the interval is not too narrow. Two runs scored on the same targets are compared
**paired**: the same blocks are drawn for both, so what the text makes hard cancels out and only the difference
between the models is resampled. The resampling seed is fixed, so the same inputs give the same interval.
"""

from __future__ import annotations

import math

import numpy as np

LEVEL = 0.95


def block_sums(nll: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-target NLL (in target order) cut into `blocks` contiguous blocks of near-equal size: (NLL sums, counts)."""
    count = max(1, min(blocks, len(nll)))
    edges = np.linspace(0, len(nll), count + 1).round().astype(np.int64)
    sums = np.add.reduceat(nll, edges[:-1]) if len(nll) else np.zeros(1)
    return sums.astype(np.float64), np.diff(edges)


def _resample_indices(blocks: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, blocks, size=(resamples, blocks))


def bpc_interval(nll_sums, tokens, resamples: int, seed: int) -> list[float]:
    """The 95% bootstrap interval of sum(nll) / sum(tokens) in bits, blocks resampled with replacement."""
    nll_sums, tokens = np.asarray(nll_sums, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
    picks = _resample_indices(len(tokens), resamples, seed)
    bpc = nll_sums[picks].sum(axis=1) / tokens[picks].sum(axis=1) / math.log(2)
    low, high = np.quantile(bpc, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(low), float(high)]


def paired_difference(nll_sums_a, nll_sums_b, tokens, resamples: int, seed: int) -> dict:
    """B - A in bpc on the same targets, with its paired 95% interval (the same blocks drawn for both runs)."""
    a, b = np.asarray(nll_sums_a, dtype=np.float64), np.asarray(nll_sums_b, dtype=np.float64)
    tokens = np.asarray(tokens, dtype=np.float64)
    if not (a.shape == b.shape == tokens.shape):
        raise ValueError("paired blocks must be the same blocks of the same targets in both runs")
    picks = _resample_indices(len(tokens), resamples, seed)
    diffs = (b[picks].sum(axis=1) - a[picks].sum(axis=1)) / tokens[picks].sum(axis=1) / math.log(2)
    low, high = np.quantile(diffs, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"difference": float((b.sum() - a.sum()) / tokens.sum() / math.log(2)), "ci95": [float(low), float(high)]}
