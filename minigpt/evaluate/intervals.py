"""How sure a bits-per-character figure is: a bootstrap over contiguous blocks of the scored targets.

A split's targets are cut into contiguous blocks by character position (their summed NLL, token and character
counts are what evaluate keeps), so runs of any two tokenizers on the same text have the same blocks. The bpc of
a resample is sum(NLL) / sum(characters) / ln 2 over blocks drawn with replacement; the 95% interval is the 2.5th
and 97.5th percentile over the resamples. Blocks rather than single characters, because neighbouring characters'
losses are correlated (a hard word is hard for several characters): resampling blocks keeps that correlation
inside each block, so the interval is not too narrow. Two runs scored on the same text are compared **paired**:
the same blocks are drawn for both, so what the text makes hard cancels out and only the difference between the
models is resampled. The resampling seed is fixed, so the same inputs give the same interval.
Groups of runs that differ only in their seeds add the noise of training itself: `group_difference`.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

LEVEL = 0.95


def character_blocks(nll: np.ndarray, chars: np.ndarray, first_chars: int, blocks: int) -> dict:
    """Per-target NLL cut into `blocks` contiguous blocks by **character** position, so that runs of different
    tokenizers scored on the same text have the same blocks: {"nll", "tokens", "chars"} per block.

    The split's characters after the first (positions 1 .. N-1; `first_chars` is what the unscored first token
    holds, `chars` what each target holds) are cut into near-equal spans, and a target goes to the span that holds
    its last character. With one character per target this is the old cut into near-equal runs of targets
    (tested), so a character run's blocks are the same either way; a BPE token that straddles an edge moves its few
    characters with it, and every comparison divides each run's NLL by its own characters."""
    chars = np.asarray(chars, dtype=np.int64)
    count = max(1, min(blocks, len(chars)))
    total = first_chars + int(chars.sum())  # N, the split's characters
    edges = 1 + np.linspace(0, total - 1, count + 1).round().astype(np.int64)
    last_char = first_chars + np.cumsum(chars) - 1  # each target's last character's position in the split
    block = np.clip(np.searchsorted(edges, last_char, side="right") - 1, 0, count - 1)
    return {"nll": np.bincount(block, weights=np.asarray(nll, dtype=np.float64), minlength=count),
            "tokens": np.bincount(block, minlength=count), "chars": np.bincount(block, weights=chars,
                                                                                   minlength=count).astype(np.int64)}


def _resample_indices(blocks: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, blocks, size=(resamples, blocks))


def bpc_interval(nll_sums, chars, resamples: int, seed: int) -> list[float]:
    """The 95% bootstrap interval of sum(nll) / sum(chars) in bits, blocks resampled with replacement."""
    nll_sums, chars = np.asarray(nll_sums, dtype=np.float64), np.asarray(chars, dtype=np.float64)
    picks = _resample_indices(len(chars), resamples, seed)
    bpc = nll_sums[picks].sum(axis=1) / chars[picks].sum(axis=1) / math.log(2)
    low, high = np.quantile(bpc, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return [float(low), float(high)]


def _ratio_difference(a, b, chars_a, chars_b, picks) -> tuple[float, np.ndarray]:
    """B's NLL per character minus A's (nats), over all blocks and over each resample of `picks`."""
    if chars_a is chars_b:  # one denominator: the difference of the sums
        return ((b.sum() - a.sum()) / chars_a.sum(),
                (b[picks].sum(axis=1) - a[picks].sum(axis=1)) / chars_a[picks].sum(axis=1))
    return (b.sum() / chars_b.sum() - a.sum() / chars_a.sum(),
            b[picks].sum(axis=1) / chars_b[picks].sum(axis=1) - a[picks].sum(axis=1) / chars_a[picks].sum(axis=1))


def _characters(chars_a, chars_b) -> tuple[np.ndarray, np.ndarray]:
    chars_a = np.asarray(chars_a, dtype=np.float64)
    return chars_a, chars_a if chars_b is None else np.asarray(chars_b, dtype=np.float64)


def paired_difference(nll_sums_a, nll_sums_b, chars, resamples: int, seed: int, chars_b=None) -> dict:
    """B - A in bpc on the same blocks of the same text, with its paired 95% interval (the same blocks drawn for
    both runs). `chars_b`: B's characters per block where its tokens cut the blocks' edges a little differently
    (another tokenizer, `character_blocks`); each run's NLL is divided by its own characters."""
    a, b = np.asarray(nll_sums_a, dtype=np.float64), np.asarray(nll_sums_b, dtype=np.float64)
    chars_a, chars_b = _characters(chars, chars_b)
    if not (a.shape == b.shape == chars_a.shape == chars_b.shape):
        raise ValueError("paired blocks must be the same blocks of the same targets in both runs")
    whole, diffs = _ratio_difference(a, b, chars_a, chars_b, _resample_indices(len(chars_a), resamples, seed))
    low, high = np.quantile(diffs / math.log(2), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"difference": float(whole / math.log(2)), "ci95": [float(low), float(high)]}


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


def group_difference(sums_a, sums_b, chars, resamples: int, seed: int, chars_b=None) -> dict:
    """B - A between the mean bpc ("a", "b") of two groups of runs that differ only in their seeds, all scored on
    the same blocks (`sums_a`: one row of block NLL sums per run of A, at least two rows each; `chars_b`: B's
    characters per block where another tokenizer cuts them, as in `paired_difference`).

    Two sources of noise: training (another seed gives another model) and the text (which blocks are in the split).
    The first is the runs' spread, s^2 / n per group; the second the paired bootstrap of the groups' mean models
    over the same blocks. Their variances add; the 95% interval is Student's t with Welch-Satterthwaite degrees of
    freedom, so three seeds per group give a wide interval, as they should."""
    a, b = np.asarray(sums_a, dtype=np.float64), np.asarray(sums_b, dtype=np.float64)
    chars_a, chars_b = _characters(chars, chars_b)
    if a.ndim != 2 or b.ndim != 2 or len({a.shape[1], b.shape[1], len(chars_a), len(chars_b)}) > 1:
        raise ValueError("every run of both groups must be scored on the same blocks of the same targets")
    if min(len(a), len(b)) < 2:
        raise ValueError("a group needs at least two runs (seeds) to have a spread")
    bpc_a = a.sum(axis=1) / chars_a.sum() / math.log(2)
    bpc_b = b.sum(axis=1) / chars_b.sum() / math.log(2)
    picks = _resample_indices(len(chars_a), resamples, seed)
    _, text = _ratio_difference(a.mean(axis=0), b.mean(axis=0), chars_a, chars_b, picks)
    parts = [(bpc_a.var(ddof=1) / len(a), len(a) - 1), (bpc_b.var(ddof=1) / len(b), len(b) - 1),
             (float((text / math.log(2)).var(ddof=1)), len(chars_a) - 1)]
    means = {"a": float(bpc_a.mean()), "b": float(bpc_b.mean())}
    difference = means["b"] - means["a"]
    return {**means, "difference": difference, **welch_interval(difference, parts),
            "se_seeds": math.sqrt(parts[0][0] + parts[1][0]), "se_text": math.sqrt(parts[2][0])}


def welch_interval(difference: float, parts: list[tuple[float, int]]) -> dict:
    """{"ci95", "df"} of a difference whose variance is the sum of independent parts (variance, degrees of
    freedom): Student's t with Welch-Satterthwaite degrees of freedom (infinite, and a zero-width interval, when
    every part is 0)."""
    variance = sum(v for v, _ in parts)
    if variance == 0:
        return {"ci95": [difference, difference], "df": math.inf}
    df = variance ** 2 / sum(v ** 2 / dof for v, dof in parts if v > 0)
    half = student_t_quantile((1 + LEVEL) / 2, df) * math.sqrt(variance)
    return {"ci95": [difference - half, difference + half], "df": float(df)}
