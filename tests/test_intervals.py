"""The uncertainty of a bits-per-character figure: a bootstrap over contiguous blocks of the scored targets, and the
paired difference of two runs scored on the same targets."""

import math

import numpy as np
import pytest

from helpers.blocks import block_sums
from minigpt.evaluate.intervals import bpc_interval, character_blocks, paired_difference

RESAMPLES, SEED = 2000, 0


def nll_of(n: int, seed: int = 1) -> np.ndarray:
    """Per-target NLLs shaped like a model's: mostly small, some large (hard characters)."""
    return np.random.default_rng(seed).gamma(shape=1.2, scale=1.3, size=n)


def test_blocks_are_contiguous_near_equal_and_keep_every_target_once():
    nll = nll_of(10_007)
    sums, counts = block_sums(nll, 200)
    assert len(sums) == len(counts) == 200 and counts.sum() == len(nll) and counts.max() - counts.min() <= 1
    assert sums.sum() == pytest.approx(nll.sum(), rel=1e-12)
    assert sums[0] == pytest.approx(nll[:counts[0]].sum())  # the first block is the first targets
    assert len(block_sums(nll[:50], 200)[0]) == 50, "never more blocks than targets"


@pytest.mark.parametrize("n, blocks", [(10_007, 200), (999, 200), (50, 200), (1, 200), (12_345, 7)])
def test_a_character_tokenizer_is_cut_exactly_as_before_the_character_cut(n, blocks):
    """One character per target: the character cut is the old cut of the targets into near-equal runs (edges
    rounded from linspace over the targets), so character runs keep their blocks, intervals and pairings."""
    nll = nll_of(n)
    edges = np.linspace(0, n, min(blocks, n) + 1).round().astype(np.int64)
    cut = character_blocks(nll, np.ones(n, dtype=np.int64), 1, blocks)
    assert cut["tokens"].tolist() == np.diff(edges).tolist() == cut["chars"].tolist()
    np.testing.assert_allclose(cut["nll"], np.add.reduceat(nll, edges[:-1]), rtol=1e-12)


def tokens_of(n_chars: int, seed: int = 5) -> np.ndarray:
    """The characters each token of a BPE-like tokenization holds (1 to 6), covering exactly n_chars."""
    lengths = np.random.default_rng(seed).integers(1, 7, size=n_chars)
    lengths = lengths[: int(np.searchsorted(np.cumsum(lengths), n_chars)) + 1]
    lengths[-1] -= int(lengths.sum()) - n_chars
    return lengths[lengths > 0]


def test_two_tokenizers_of_one_text_get_the_same_character_blocks():
    n_chars, blocks = 30_001, 200
    char_cut = character_blocks(nll_of(n_chars - 1), np.ones(n_chars - 1, dtype=np.int64), 1, blocks)
    lengths = tokens_of(n_chars)
    bpe_cut = character_blocks(nll_of(len(lengths) - 1), lengths[1:], int(lengths[0]), blocks)
    assert len(bpe_cut["nll"]) == blocks and bpe_cut["tokens"].sum() == len(lengths) - 1
    assert bpe_cut["chars"].sum() == n_chars - lengths[0], "every character but the first token's, once"
    # a token straddling an edge moves its few characters with it: the blocks hold the same text within a token
    assert np.abs(bpe_cut["chars"] - char_cut["chars"]).max() < 2 * lengths.max()


def test_a_model_of_another_tokenizer_is_compared_paired_on_the_same_characters():
    """A BPE-like run whose token's NLL is its characters' NLL under the char run plus a known cost per character:
    the paired difference finds that cost, inside an interval much narrower than either run's own."""
    n_chars, blocks, cost = 60_001, 200, 0.03
    per_char = nll_of(n_chars, seed=2)  # the char run's NLL of characters 0..N-1 (character 0 is never scored)
    char_cut = character_blocks(per_char[1:], np.ones(n_chars - 1, dtype=np.int64), 1, blocks)
    lengths = tokens_of(n_chars)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    per_token = np.add.reduceat(per_char, starts) + cost * lengths
    bpe_cut = character_blocks(per_token[1:], lengths[1:], int(lengths[0]), blocks)
    result = paired_difference(char_cut["nll"], bpe_cut["nll"], char_cut["chars"], RESAMPLES, SEED,
                               chars_b=bpe_cut["chars"])
    expected = bpe_cut["nll"].sum() / bpe_cut["chars"].sum() / math.log(2) - per_char[1:].mean() / math.log(2)
    assert result["difference"] == pytest.approx(expected, rel=1e-9)
    assert abs(result["difference"] - cost / math.log(2)) < 0.01
    low, high = result["ci95"]
    own = bpc_interval(char_cut["nll"], char_cut["chars"], RESAMPLES, SEED)
    assert low < cost / math.log(2) < high and (high - low) < 0.2 * (own[1] - own[0]), (result, own)
    with pytest.raises(ValueError, match="same blocks"):
        paired_difference(char_cut["nll"], bpe_cut["nll"][:-1], char_cut["chars"], RESAMPLES, SEED,
                          chars_b=bpe_cut["chars"][:-1])


def test_the_interval_holds_the_figure_and_is_reproducible():
    sums, counts = block_sums(nll_of(20_000), 200)
    low, high = bpc_interval(sums, counts, RESAMPLES, SEED)
    bpc = sums.sum() / counts.sum() / math.log(2)
    assert low < bpc < high
    assert bpc_interval(sums, counts, RESAMPLES, SEED) == [low, high]


def test_the_interval_narrows_as_blocks_are_added():
    widths = []
    for n in (5_000, 20_000, 80_000):  # blocks of 100 targets each: 50, 200, 800 blocks
        sums, counts = block_sums(nll_of(n), n // 100)
        low, high = bpc_interval(sums, counts, RESAMPLES, SEED)
        widths.append(high - low)
    assert widths[1] < 0.7 * widths[0] and widths[2] < 0.7 * widths[1], widths  # about 1/2 per 4x the data


def test_identical_runs_differ_by_zero_with_an_interval_holding_zero():
    sums, counts = block_sums(nll_of(20_000), 200)
    result = paired_difference(sums, sums.copy(), counts, RESAMPLES, SEED)
    assert result["difference"] == 0.0 and result["ci95"][0] <= 0.0 <= result["ci95"][1]


@pytest.mark.parametrize("shift_nats", [0.01, -0.01])
def test_a_known_shift_is_reported_with_its_size_and_sign(shift_nats):
    a = nll_of(20_000)
    b = a + shift_nats + np.random.default_rng(7).normal(0, 0.05, size=a.shape)  # B: worse (or better) by the shift
    sums_a, counts = block_sums(a, 200)
    sums_b, _ = block_sums(b, 200)
    result = paired_difference(sums_a, sums_b, counts, RESAMPLES, SEED)
    expected = shift_nats / math.log(2)
    assert result["difference"] == pytest.approx(expected, abs=0.002)
    low, high = result["ci95"]
    assert low <= result["difference"] <= high and (low > 0 if shift_nats > 0 else high < 0), result
    # unpaired, the same shift hides in the text's own variation: one run's interval is wider than the shift, and
    # several times wider than the paired interval of the difference
    low_a, high_a = bpc_interval(sums_a, counts, RESAMPLES, SEED)
    assert high_a - low_a > 2 * abs(expected) and high - low < (high_a - low_a) / 5


def test_paired_blocks_must_be_the_same_blocks():
    with pytest.raises(ValueError, match="same blocks"):
        paired_difference(np.ones(3), np.ones(4), np.ones(3), RESAMPLES, SEED)
