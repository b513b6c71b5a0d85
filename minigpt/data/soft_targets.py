"""Soft targets for training: at every position of train, the next-token distribution of a Kneser-Ney n-gram that
never saw that position (cross-fitted), kept as its `top` most likely tokens.

Train is cut into `folds` contiguous folds; each fold is predicted by the n-gram counted on the other folds, with
contexts read from train itself. A model trained towards these targets (minigpt.train.distill) learns what counting
train's n-grams knows without being taught the position's own continuation: a leave-one-out count keeps the rest of
the article (its names, its phrases) and gave far sharper targets than a held-out n-gram can match (1.76 bits/char on
wt2-mini train against 2.30 held out; cross-fitted: 2.20).

The n-gram is minigpt.evaluate.ngram's interpolated Kneser-Ney (same discount, continuation counts below the top
order), but here the whole distribution of every position is needed, not one target's probability. Per position,
with a_k = D T(h_k) / c(h_k) and s_k(w) = max(c(h_k w) - D, 0) / c(h_k) at level k (a_k = 1, s_k = 0 where the
context h_k was not counted):  p(w) = sum_k (prod_{j>k} a_j) s_k(w) + (prod_k a_k) / V.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK = 8192  # positions scored at once: a dense [CHUNK, V] float64 block


@dataclass(frozen=True)
class _Counts:
    """An n-gram's counts over one text. Level k has one row per distinct k-gram, sorted by (context ID, token):
    context_of[k] (ID of its first k-1 tokens at level k-1), token_of[k], count[k] (raw at the top order, else the
    continuation count); per context of level k: total[k], distinct[k] and its rows [row_start[k], row_end[k])."""
    order: int
    vocab: int
    context_of: dict
    token_of: dict
    count: dict
    total: dict
    distinct: dict
    row_start: dict
    row_end: dict


def count_ngrams(text: np.ndarray, vocab: int, order: int) -> _Counts:
    text = np.asarray(text, dtype=np.int64)
    n = len(text)
    gram_at = {1: text}  # ID of the k-gram ending at each position (-1 before position k-1)
    context_of, token_of, grams = {1: np.zeros(vocab, dtype=np.int64)}, {1: np.arange(vocab)}, {1: vocab}
    for k in range(2, order + 1):
        keys = gram_at[k - 1][k - 2:n - 1] * vocab + text[k - 1:]
        unique, inverse = np.unique(keys, return_inverse=True)
        gram_at[k] = np.concatenate([np.full(k - 1, -1), inverse.ravel()])
        context_of[k], token_of[k], grams[k] = unique // vocab, unique % vocab, len(unique)
    count = {order: np.bincount(gram_at[order][order - 1:], minlength=grams[order])}
    for k in range(1, order):  # continuation count of a k-gram: the distinct (k+1)-grams that end with it
        suffix = np.zeros(grams[k + 1], dtype=np.int64)
        suffix[gram_at[k + 1][k:]] = gram_at[k][k:]
        count[k] = np.bincount(suffix, minlength=grams[k])
    contexts = {k: 1 if k == 1 else grams[k - 1] for k in count}
    return _Counts(
        order, vocab, context_of, token_of, count,
        total={k: np.bincount(context_of[k], weights=count[k], minlength=contexts[k]) for k in count},
        distinct={k: np.bincount(context_of[k], weights=count[k] > 0, minlength=contexts[k]) for k in count},
        row_start={k: np.searchsorted(context_of[k], np.arange(contexts[k]), "left") for k in count},
        row_end={k: np.searchsorted(context_of[k], np.arange(contexts[k]), "right") for k in count},
    )


def _context_ids(counts: _Counts, text: np.ndarray) -> dict:
    """At each position t of text: the counted ID of the k-gram ending at t (-1 where it was never counted)."""
    n, vocab = len(text), counts.vocab
    found = {1: text}
    for k in range(2, counts.order):
        ids = np.full(n, -1, dtype=np.int64)
        before = found[k - 1][k - 2:n - 1]
        key = before * vocab + text[k - 1:]
        keys = counts.context_of[k] * vocab + counts.token_of[k]  # sorted: np.unique made them
        at = np.minimum(np.searchsorted(keys, key), len(keys) - 1)
        ids[k - 1:] = np.where((before >= 0) & (keys[at] == key), at, -1)
        found[k] = ids
    return found


def heldout_topk(counts: _Counts, text: np.ndarray, positions: np.ndarray, top: int, discount: float):
    """The counted n-gram's distribution of text[t] given the tokens before t, at each of `positions` (>= 1):
    (ids [m, top], probs [m, top] renormalised over the kept tokens, bits [m] of text[t] under the full
    distribution, kept [m] the full distribution's mass on the kept tokens)."""
    text = np.asarray(text, dtype=np.int64)
    vocab, order = counts.vocab, counts.order
    ends = _context_ids(counts, text)
    positions = np.asarray(positions, dtype=np.int64)
    top = min(top, vocab)
    ids, probs = np.zeros((len(positions), top), np.int64), np.zeros((len(positions), top), np.float32)
    bits, kept = np.zeros(len(positions)), np.zeros(len(positions))
    for begin in range(0, len(positions), CHUNK):
        t = positions[begin:begin + CHUNK]
        m = len(t)
        weight = np.ones(m)  # prod_{j>k} a_j
        dense = np.zeros(m * vocab)
        for k in range(order, 0, -1):
            if k == 1:
                context = np.zeros(m, dtype=np.int64)
            else:  # the k-1 tokens before t; too few of them (or never counted) backs off
                context = np.where(t >= k - 1, ends[k - 1][t - 1], -1)
            known = context >= 0
            safe_context = np.where(known, context, 0)
            total = np.where(known, counts.total[k][safe_context], 0.0)
            seen = total > 0
            divisor = np.where(seen, total, 1.0)
            lengths = np.where(seen, counts.row_end[k][safe_context] - counts.row_start[k][safe_context], 0)
            row = np.repeat(np.arange(m), lengths)
            first = np.repeat(counts.row_start[k][safe_context] - (np.cumsum(lengths) - lengths), lengths)
            gram = np.arange(lengths.sum()) + first
            share = np.maximum(counts.count[k][gram] - discount, 0) / divisor[row]
            dense += np.bincount(row * vocab + counts.token_of[k][gram], weights=share * weight[row],
                                 minlength=m * vocab)
            weight = weight * np.where(seen, discount * counts.distinct[k][safe_context] / divisor, 1.0)
        p = dense.reshape(m, vocab) + weight[:, None] / vocab
        rows = slice(begin, begin + m)
        bits[rows] = -np.log2(p[np.arange(m), text[t]])
        best = np.argpartition(p, vocab - top, axis=1)[:, vocab - top:]
        mass = np.take_along_axis(p, best, axis=1)
        kept[rows] = mass.sum(1)
        ids[rows], probs[rows] = best, (mass / mass.sum(1, keepdims=True)).astype(np.float32)
    return ids, probs, bits, kept


def fold_edges(length: int, folds: int) -> np.ndarray:
    """The folds' boundaries: fold f is positions [edges[f], edges[f + 1])."""
    return np.linspace(0, length, folds + 1).astype(np.int64)


def counted_without(text: np.ndarray, edges: np.ndarray, fold: int) -> np.ndarray:
    """The text the n-gram of `fold` counts: every other fold, end to end (a few n-grams span the seam)."""
    return np.concatenate([text[:edges[fold]], text[edges[fold + 1]:]])


def crossfit_soft_targets(text: np.ndarray, vocab: int, order: int, folds: int, top: int, discount: float):
    """Every position t >= 1 of text predicted by the n-gram counted without t's fold; position 0 (no context) is
    one-hot on text[0] and scores 0 bits. Returns (ids, probs, bits, kept) as heldout_topk does, one row a position."""
    text = np.asarray(text, dtype=np.int64)
    top = min(top, vocab)
    ids, probs = np.zeros((len(text), top), np.int64), np.zeros((len(text), top), np.float32)
    bits, kept = np.zeros(len(text)), np.ones(len(text))
    ids[0, 0], probs[0, 0] = text[0], 1.0
    ids[0, 1:] = (text[0] + 1 + np.arange(top - 1)) % vocab  # distinct ids, zero probability
    edges = fold_edges(len(text), folds)
    for fold in range(folds):
        where = np.arange(max(edges[fold], 1), edges[fold + 1])
        counts = count_ngrams(counted_without(text, edges, fold), vocab, order)
        ids[where], probs[where], bits[where], kept[where] = heldout_topk(counts, text, where, top, discount)
    return ids, probs, bits, kept
