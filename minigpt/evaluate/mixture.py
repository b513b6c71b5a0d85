"""The model mixed with a Kneser-Ney n-gram counted on train: a separate, labelled figure (evaluation.json
"mixture"), never the model's own val/test bpc.

Per target, p = w * p_model + (1 - w) * p_ngram, one weight w for the whole split. The n-gram is counted on the
encoded train split (the model's own tokens, so both predict exactly the same targets, for any tokenizer) and
scored on val and test as the baselines are (minigpt.evaluate.ngram). Nothing adapts to the scored text except w:
val's figure is cross-fitted (w fitted on one half of val scores the other half, and the other way round), test's
uses w fitted on all of val. What it says: how much of what a counted n-gram knows the model has not learned; a
weight well below 1 marks a model that is short of data, steps or capacity for the statistics the n-gram memorises.
"""

from __future__ import annotations

import math

import numpy as np

from minigpt.evaluate.ngram import kneser_ney_bits
from minigpt.evaluate.scoring import summarise

LABEL = ("static mixture of the model with an n-gram counted on train: p = w p_model + (1 - w) p_ngram per target, "
         "w fitted on the other half of val (on all of val for test); not the model's own figure")

_GOLDEN = (math.sqrt(5) - 1) / 2


def mixed_nll(model_nll: np.ndarray, ngram_nll: np.ndarray, weight: float) -> np.ndarray:
    """-ln(w e^-a + (1 - w) e^-b) per target, in nats, computed in log space (no underflow for unlikely targets)."""
    log_w = math.log(weight) if weight > 0 else -math.inf  # ln 0 = -inf: w = 0 or 1 gives one side exactly
    log_rest = math.log1p(-weight) if weight < 1 else -math.inf
    return -np.logaddexp(log_w - np.asarray(model_nll), log_rest - np.asarray(ngram_nll))


def best_weight(model_nll: np.ndarray, ngram_nll: np.ndarray, tolerance: float = 1e-4) -> float:
    """The w in [0, 1] that minimises the mean mixed NLL (convex in w, so a golden-section search finds it)."""
    def cost(w: float) -> float:
        return float(mixed_nll(model_nll, ngram_nll, w).mean())

    low, high = 0.0, 1.0
    left, right = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    cost_left, cost_right = cost(left), cost(right)
    while high - low > tolerance:
        if cost_left <= cost_right:
            high, right, cost_right = right, left, cost_left
            left = high - _GOLDEN * (high - low)
            cost_left = cost(left)
        else:
            low, left, cost_left = left, right, cost_right
            right = low + _GOLDEN * (high - low)
            cost_right = cost(right)
    # the ends are candidates too: a model the n-gram adds nothing to sits at w = 1
    return min((0.0, (low + high) / 2, 1.0), key=cost)


def cross_fitted(model_nll: np.ndarray, ngram_nll: np.ndarray) -> tuple[np.ndarray, list[float]]:
    """The mixed NLL of every target, each half scored with the weight fitted on the other half; and both weights."""
    half = len(model_nll) // 2
    first, second = slice(0, half), slice(half, None)
    weights = [best_weight(model_nll[second], ngram_nll[second]), best_weight(model_nll[first], ngram_nll[first])]
    nll = np.concatenate([mixed_nll(model_nll[first], ngram_nll[first], weights[0]),
                          mixed_nll(model_nll[second], ngram_nll[second], weights[1])])
    return nll, weights


def mixture_figures(train_ids: np.ndarray, scored: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                    vocab_size: int, order: int, discount: float) -> dict:
    """The "mixture" report: `scored` maps "val" and "test" to (ids, the model's NLL per target in nats, the
    characters per target). val is cross-fitted; test uses the weight fitted on all of val."""
    bits = kneser_ney_bits(train_ids, {s: ids for s, (ids, _, _) in scored.items()}, vocab_size, [order], discount)
    ngram = {s: b * math.log(2) for s, b in bits[order].items()}  # bits -> nats, like the model's
    (_, val_model, val_chars), (_, test_model, test_chars) = scored["val"], scored["test"]
    val_nll, halves = cross_fitted(val_model, ngram["val"])
    weight = best_weight(val_model, ngram["val"])
    return {"label": LABEL, "order": order, "discount": discount, "weight": weight, "weights_of_val_halves": halves,
            "ngram": {s: summarise(ngram[s], scored[s][2]) for s in scored},
            "val": summarise(val_nll, val_chars),
            "test": summarise(mixed_nll(test_model, ngram["test"], weight), test_chars)}
