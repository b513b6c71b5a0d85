"""Hashed n-gram input embeddings (model.ngram_orders): what a counted n-gram knows, handed to the network as input.

For each position t and each order n in 2 .. ngram_orders, the n tokens ending at t (t itself and the n - 1 before
it) are hashed into one of model.ngram_buckets rows of that order's table; the rows are summed and added to the
token embedding. Only t and its past are read, so causality is unchanged. Where the n-gram would start before the
first token the model was given (the start of a window, or of a KV cache), the missing places hold a padding ID, so
a window scores the same whether it is fed at once or one token at a time.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# a polynomial hash kept below 2**31 at every step, so h * MULTIPLIER + id never overflows int64
MODULUS = 2_147_483_647  # 2**31 - 1, prime
MULTIPLIER = 1_000_003


def ngram_rows(ids: torch.Tensor, orders: int, buckets: int, pad_id: int, history: torch.Tensor | None = None):
    """ids [B, T] (history [B, H]: the tokens just before them, if any) -> [orders - 1, B, T] row indices into a
    table of (orders - 1) * buckets rows: order n's rows start at (n - 2) * buckets."""
    time = ids.shape[1]
    seen = ids if history is None else torch.cat([history, ids], dim=1)
    padded = F.pad(seen, (orders - 1, 0), value=pad_id).long()
    end = padded.shape[1]
    rows, code = [], padded[:, end - time:]  # order 1: the token itself
    for back in range(1, orders):  # extend each position's n-gram by the token `back` places before it
        code = (code * MULTIPLIER + padded[:, end - time - back:end - back]) % MODULUS
        rows.append(code % buckets + (back - 1) * buckets)
    return torch.stack(rows)


class HashedNgramEmbedding(nn.Module):
    """The summed n-gram rows of each position ([B, T] -> [B, T, width]); `orders` 2 or more."""

    def __init__(self, vocab_size: int, orders: int, buckets: int, width: int):
        super().__init__()
        self.orders, self.buckets, self.pad_id = orders, buckets, vocab_size  # no token has the ID vocab_size
        self.table = nn.Embedding((orders - 1) * buckets, width)

    def forward(self, ids: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        return self.table(ngram_rows(ids, self.orders, self.buckets, self.pad_id, history)).sum(0)
