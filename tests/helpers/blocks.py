"""Blocks of a character tokenizer's split (one character per target), as evaluate cuts them."""

import numpy as np

from minigpt.evaluate.intervals import character_blocks


def block_sums(nll: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """(NLL sums, target counts) of `blocks` contiguous blocks of near-equal size."""
    cut = character_blocks(nll, np.ones(len(nll), dtype=np.int64), 1, blocks)
    return cut["nll"], cut["tokens"]
