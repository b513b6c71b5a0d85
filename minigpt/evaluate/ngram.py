"""Character n-gram models with interpolated Kneser-Ney smoothing, counted with numpy (no Python loop per token).

The model of order n (one discount D in (0, 1]) predicts token w after the n-1 tokens h before it:

    p_n(w | h) = (max(c(hw) - D, 0) + D * T(h) * p_{n-1}(w | h')) / c(h)      (c(h) > 0; else p_{n-1}(w | h'))

where h' drops the oldest token of h, c counts in train, and T(h) is the number of distinct tokens seen after h.
The lower orders use continuation counts instead of raw counts: c'(gw) = the number of distinct tokens seen
before gw, so a token that only ever follows one context gets little mass of its own. Order 1 (continuation
counts of single tokens) is interpolated the same way with the uniform distribution over the vocabulary, so every
token of the vocabulary gets a probability > 0 and the distribution sums to 1 for every context.

A target with fewer than n-1 tokens before it in its split is predicted from the context it has, by the
(continuation) distribution of that order. n-grams never cross a split's boundaries.

Counting: every k-gram gets an exact integer ID (np.unique over the pair (ID of its first k-1 tokens, its last
token)), over train and the scored splits at once, so the same k-gram has the same ID everywhere and counts are
bincounts indexed by ID.
"""

from __future__ import annotations

import numpy as np


def _segments(splits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The splits end to end: tokens, each position's offset inside its split, and each position's split index."""
    tokens = np.concatenate([np.asarray(s, dtype=np.int64) for s in splits])
    lengths = np.array([len(s) for s in splits])
    split_of = np.repeat(np.arange(len(splits)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    offset = np.arange(len(tokens)) - starts[split_of]
    return tokens, offset, split_of


def _stats(gram_ids: np.ndarray, context_of: np.ndarray, num_contexts: int, num_grams: int) -> tuple:
    """Counts of each gram over the given events, and per context their sum and number of distinct grams."""
    counts = np.bincount(gram_ids, minlength=num_grams)
    totals = np.bincount(context_of[gram_ids], minlength=num_contexts)
    distinct = np.bincount(context_of[np.flatnonzero(counts)], minlength=num_contexts)
    return counts, totals, distinct


def kneser_ney_bits(train: np.ndarray, scored: dict[str, np.ndarray], vocab_size: int, orders: list[int],
                    discount: float) -> dict[int, dict[str, np.ndarray]]:
    """-log2 p of every target of each scored split (positions 1..len-1), for each order in `orders`.

    Returns {order: {split name: float64 array of len(split) - 1 bits}}. Token IDs must be < vocab_size.
    """
    if not 0 < discount <= 1:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    if not orders or min(orders) < 1:
        raise ValueError(f"orders must be >= 1, got {orders}")
    names = list(scored)
    tokens, offset, split_of = _segments([train] + [scored[n] for n in names])
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token IDs must be in [0, {vocab_size})")
    is_train = split_of == 0
    targets = np.flatnonzero(~is_train & (offset >= 1))  # every scored target once
    top = max(orders)

    # per level k (1..top): at each target, the counts the formula needs, raw (k-gram as the highest order) and
    # continuation (k-gram as a lower order); (c, total, distinct) with total 0 where the context is unseen
    raw, cont = {}, {}
    prev_ids = np.zeros(len(tokens), dtype=np.int64)  # order 0: the empty context, one ID
    prev_count = 1
    # the previous level's arrays (set at the end of each pass; level 1 has no lower order to count)
    prev_valid = prev_context = prev_context_of = prev_context_count = None
    for k in range(1, top + 1):
        valid = offset >= k - 1
        context = np.full(len(tokens), -1, dtype=np.int64)  # ID of the k-1 tokens before each position
        if k == 1:
            context[:] = 0
        else:
            context[1:] = np.where(valid[1:], prev_ids[:-1], -1)
        ids = np.full(len(tokens), -1, dtype=np.int64)
        if k == 1:
            ids[:] = tokens
            count = vocab_size
        else:
            uniq, inverse = np.unique(context[valid] * vocab_size + tokens[valid], return_inverse=True)
            ids[valid] = inverse
            count = len(uniq)
        context_of = np.zeros(count, dtype=np.int64)
        context_of[ids[valid]] = context[valid]
        scored_valid = targets[valid[targets]]
        if k in orders:  # raw counts of k-grams in train
            c, total, distinct = _stats(ids[valid & is_train], context_of, prev_count, count)
            raw[k] = _at(scored_valid, ids, context, c, total, distinct)
        if k >= 2:  # continuation counts of (k-1)-grams: one per distinct k-gram of train that ends with them
            suffix_of = np.zeros(count, dtype=np.int64)
            suffix_of[ids[valid]] = prev_ids[valid]
            in_train = np.bincount(ids[valid & is_train], minlength=count) > 0
            suffixes = suffix_of[in_train]
            c, total, distinct = _stats(suffixes, prev_context_of, prev_context_count, prev_count)
            prev_scored = targets[prev_valid[targets]]
            cont[k - 1] = _at(prev_scored, prev_ids, prev_context, c, total, distinct)
        prev_valid, prev_context, prev_context_of, prev_context_count = valid, context, context_of, prev_count
        prev_ids, prev_count = ids, count

    out = {}
    for order in orders:
        p = np.full(len(targets), 1.0 / vocab_size)
        for k in range(1, order + 1):
            positions, c, total, distinct = (raw if k == order else cont)[k]
            where = np.searchsorted(targets, positions)
            seen = total > 0
            step = np.where(seen,
                            (np.maximum(c - discount, 0) + discount * distinct * p[where]) / np.where(seen, total, 1),
                            p[where])
            p[where] = step
        bits = -np.log2(p)
        out[order] = {name: bits[split_of[targets] == i + 1] for i, name in enumerate(names)}
    return out


def _at(positions: np.ndarray, ids: np.ndarray, context: np.ndarray, counts, totals, distinct) -> tuple:
    """The level's (c, total, distinct) at the given target positions, as float64."""
    g, h = ids[positions], context[positions]
    return positions, counts[g].astype(np.float64), totals[h].astype(np.float64), distinct[h].astype(np.float64)
