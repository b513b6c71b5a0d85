"""The uncertainty of a bits-per-character figure: a bootstrap over contiguous blocks of the scored targets, and the
paired difference of two runs scored on the same targets."""

import math

import numpy as np
import pytest

from minigpt.evaluate.intervals import block_sums, bpc_interval, paired_difference

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
