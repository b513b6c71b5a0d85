"""The model mixed with a counted n-gram (minigpt.evaluate.mixture): the mixing, the weight fit, the cross-fit."""

import math

import numpy as np
import pytest

from minigpt.evaluate.mixture import best_weight, cross_fitted, mixed_nll, mixture_figures
from minigpt.evaluate.ngram import kneser_ney_bits


def _complementary(n=4000, seed=0):
    """Two predictors, each sure and right on its own half of the targets and poor on the other's."""
    rng = np.random.default_rng(seed)
    good, poor = rng.uniform(0.05, 0.3, n), rng.uniform(2.0, 4.0, n)
    model_wins = rng.random(n) < 0.6
    return np.where(model_wins, good, poor), np.where(model_wins, poor, good)


def test_mixed_nll_is_either_side_at_the_ends_and_the_mixture_in_between():
    a, b = np.array([0.1, 2.0, 5.0]), np.array([3.0, 0.5, 5.0])
    assert np.allclose(mixed_nll(a, b, 1.0), a) and np.allclose(mixed_nll(b, a, 0.0), a)
    assert np.allclose(mixed_nll(a, b, 0.3), -np.log(0.3 * np.exp(-a) + 0.7 * np.exp(-b)))
    # targets far too unlikely for exp(-nll) in float64: still finite, and the likelier side dominates
    far = mixed_nll(np.array([800.0]), np.array([900.0]), 0.5)
    assert np.isfinite(far).all() and far[0] == pytest.approx(800 + math.log(2))


def test_the_weight_fit_finds_the_grid_minimum_and_beats_both_sides():
    model, ngram = _complementary()
    weight = best_weight(model, ngram)
    grid = np.linspace(0, 1, 2001)
    costs = [mixed_nll(model, ngram, w).mean() for w in grid]
    assert weight == pytest.approx(grid[int(np.argmin(costs))], abs=1e-3)
    assert 0.4 < weight < 0.8, "the model is right on 60% of the targets"
    mixed = mixed_nll(model, ngram, weight).mean()
    assert mixed < min(model.mean(), ngram.mean()) - 0.5


def test_an_n_gram_worse_on_every_target_gets_no_weight():
    model = np.random.default_rng(1).uniform(0.5, 2.0, 1000)
    assert best_weight(model, model + 0.7) == 1.0
    assert best_weight(model + 0.7, model) == 0.0


def test_each_half_of_val_is_scored_with_the_weight_fitted_on_the_other_half():
    model_a, ngram_a = _complementary(2000, seed=2)
    # the second half: the n-gram is the better predictor almost everywhere
    model_b, ngram_b = ngram_a + 1.0, model_a * 0 + 0.2
    model, ngram = np.concatenate([model_a, model_b]), np.concatenate([ngram_a, ngram_b])
    nll, (for_first, for_second) = cross_fitted(model, ngram)
    assert for_first == best_weight(model_b, ngram_b) and for_second == best_weight(model_a, ngram_a)
    assert for_first < 0.05 < for_second
    assert np.array_equal(nll[:2000], mixed_nll(model_a, ngram_a, for_first))
    assert np.array_equal(nll[2000:], mixed_nll(model_b, ngram_b, for_second))


def test_mixture_figures_mix_the_n_gram_of_the_scored_targets():
    rng = np.random.default_rng(3)
    text = np.tile(rng.integers(0, 6, 40), 60)  # a text that repeats: the n-gram learns it from train
    train, val, test = text[:1600], text[1600:2000], text[2000:]
    vocab, uniform = 6, math.log(6)
    scored = {s: (ids, np.full(len(ids) - 1, uniform), np.ones(len(ids) - 1, dtype=np.int64))
              for s, ids in (("val", val), ("test", test))}
    report = mixture_figures(train, scored, vocab, order=4, discount=0.9)
    ngram_bits = kneser_ney_bits(train, {"val": val, "test": test}, vocab, [4], 0.9)[4]
    for split in ("val", "test"):
        assert report["ngram"][split]["bpc"] == pytest.approx(ngram_bits[split].mean())
        assert report[split]["tokens"] == len(scored[split][0]) - 1
        # a uniform "model" adds almost nothing to an n-gram that knows the text
        assert abs(report[split]["bpc"] - report["ngram"][split]["bpc"]) < 0.05
    assert report["weight"] < 0.05 and report["order"] == 4 and report["label"].startswith("static mixture")
