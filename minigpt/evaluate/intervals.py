"""How sure a bits-per-character figure is: a bootstrap over contiguous blocks of the scored targets.

A split's targets are cut into contiguous blocks (their summed NLL, token and character counts are what evaluate
keeps). The bpc of a resample is sum(NLL) / sum(characters) / ln 2 over blocks drawn with replacement (a character
tokenizer's blocks hold one character per token); the 95% interval is the 2.5th and 97.5th percentile over the
resamples. Blocks rather than single characters, because neighbouring
characters' losses are correlated (a hard word is hard for several characters): resampling blocks keeps that
correlation inside each block, so the interval is not too narrow. Two runs scored on the same targets are compared
**paired**: the same blocks are drawn for both, so what the text makes hard cancels out and only the difference
between the models is resampled. The resampling seed is fixed, so the same inputs give the same interval.
Groups of runs that differ only in their seeds add the noise of training itself: `group_difference`.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

LEVEL = 0.95


def block_sums(nll: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-target NLL (in target order) cut into `blocks` contiguous blocks of near-equal size: (NLL sums, counts)."""
    count = max(1, min(blocks, len(nll)))
    edges = np.linspace(0, len(nll), count + 1).round().astype(np.int64)
    sums = np.add.reduceat(nll, edges[:-1]) if len(nll) else np.zeros(1)
    return sums.astype(np.float64), np.diff(edges)


def block_chars(chars: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The characters of each block of `block_sums` (`counts` targets each), from the characters per target."""
    edges = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    return np.add.reduceat(np.asarray(chars, dtype=np.int64), edges) if len(chars) else np.zeros(1, np.int64)


def _resample_indices(blocks: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, blocks, size=(resamples, blocks))


def bpc_interval(nll_sums, chars, resamples: int, seed: int) -> list[float]:
    """The 95% bootstrap interval of sum(nll) / sum(chars) in bits, blocks resampled with replacement."""
    nll_sums, chars = np.asarray(nll_sums, dtype=np.float64), np.asarray(chars, dtype=np.float64)
    picks = _resample_indices(len(chars), resamples, seed)
    bpc = nll_sums[picks].sum(axis=1) / chars[picks].sum(axis=1) / math.log(2)
    low, high = np.quantile(bpc, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(low), float(high)]


def paired_difference(nll_sums_a, nll_sums_b, chars, resamples: int, seed: int) -> dict:
    """B - A in bpc on the same targets, with its paired 95% interval (the same blocks drawn for both runs)."""
    a, b = np.asarray(nll_sums_a, dtype=np.float64), np.asarray(nll_sums_b, dtype=np.float64)
    chars = np.asarray(chars, dtype=np.float64)
    if not (a.shape == b.shape == chars.shape):
        raise ValueError("paired blocks must be the same blocks of the same targets in both runs")
    picks = _resample_indices(len(chars), resamples, seed)
    diffs = (b[picks].sum(axis=1) - a[picks].sum(axis=1)) / chars[picks].sum(axis=1) / math.log(2)
    low, high = np.quantile(diffs, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"difference": float((b.sum() - a.sum()) / chars.sum() / math.log(2)), "ci95": [float(low), float(high)]}


def student_t_quantile(p: float, df: float) -> float:
    """The p-quantile (p > 0.5) of Student's t with `df` degrees of freedom (any real df > 0): the CDF integrated
    from the density (Simpson's rule) and inverted by bisection. Beyond 1000 degrees the normal quantile."""
    if df > 1000:
        return NormalDist().inv_cdf(p)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        grid = np.linspace(0.0, x, 2001)
        density = np.exp(log_norm - (df + 1) / 2 * np.log1p(grid * grid / df))
        weights = np.ones(len(grid))
        weights[1:-1:2], weights[2:-1:2] = 4, 2
        return 0.5 + float((weights * density).sum()) * (x / 2000) / 3

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


def group_difference(sums_a, sums_b, chars, resamples: int, seed: int) -> dict:
    """B - A between the mean bpc ("a", "b") of two groups of runs that differ only in their seeds, all scored on
    the same blocks (`sums_a`: one row of block NLL sums per run of A, at least two rows each).

    Two sources of noise: training (another seed gives another model) and the text (which blocks are in the split).
    The first is the runs' spread, s^2 / n per group; the second the paired bootstrap of the groups' mean models
    over the same blocks. Their variances add; the 95% interval is Student's t with Welch-Satterthwaite degrees of
    freedom, so three seeds per group give a wide interval, as they should."""
    a, b = np.asarray(sums_a, dtype=np.float64), np.asarray(sums_b, dtype=np.float64)
    chars = np.asarray(chars, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != len(chars) or b.shape[1] != len(chars):
        raise ValueError("every run of both groups must be scored on the same blocks of the same targets")
    if min(len(a), len(b)) < 2:
        raise ValueError("a group needs at least two runs (seeds) to have a spread")
    to_bpc = 1 / chars.sum() / math.log(2)
    bpc_a, bpc_b = a.sum(axis=1) * to_bpc, b.sum(axis=1) * to_bpc
    picks = _resample_indices(len(chars), resamples, seed)
    text = (b.mean(axis=0)[picks].sum(axis=1) - a.mean(axis=0)[picks].sum(axis=1)) / chars[picks].sum(axis=1)
    parts = [(bpc_a.var(ddof=1) / len(a), len(a) - 1), (bpc_b.var(ddof=1) / len(b), len(b) - 1),
             (float((text / math.log(2)).var(ddof=1)), len(chars) - 1)]
    variance = sum(v for v, _ in parts)
    means = {"a": float(bpc_a.mean()), "b": float(bpc_b.mean())}
    difference = means["b"] - means["a"]
    if variance == 0:
        return {**means, "difference": difference, "ci95": [difference, difference], "se_seeds": 0.0,
                "se_text": 0.0, "df": math.inf}
    df = variance ** 2 / sum(v ** 2 / dof for v, dof in parts if v > 0)
    half = student_t_quantile((1 + LEVEL) / 2, df) * math.sqrt(variance)
    return {**means, "difference": difference, "ci95": [difference - half, difference + half],
            "se_seeds": math.sqrt(parts[0][0] + parts[1][0]), "se_text": math.sqrt(parts[2][0]), "df": float(df)}
