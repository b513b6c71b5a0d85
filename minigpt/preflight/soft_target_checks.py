"""Preflight's checks of the soft targets a run trains towards (train.distill_alpha > 0; minigpt.train.distill):
they belong to exactly this train split, each was predicted without its own fold, and each batch's soft targets are
the distributions of that batch's targets. With train.distill_alpha 0 each passes as unused.
"""

from __future__ import annotations

import numpy as np
import torch

from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.data.soft_target_files import load_soft_targets
from minigpt.data.soft_targets import count_ngrams, counted_without, fold_edges, heldout_topk
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train import distill

HELD_OUT_SAMPLE = 256  # positions of one fold recomputed from scratch
PROBABILITY_TOLERANCE = 2e-3  # stored in fp16: a probability <= 1 is off by at most 4.9e-4
ALIGNED_RATIO = 2.0  # the soft targets' mass on the targets over their mass on the inputs (or the next target)
UNUSED = {"used": False, "why": "train.distill_alpha is 0 and model.ngram_expert false: the run trains on the "
          "one-hot targets alone"}


def _used(ctx: Context) -> bool:
    return ctx.params.uses_soft_targets()


def check_soft_targets(ctx: Context) -> dict:
    if not _used(ctx):
        return UNUSED
    try:
        soft = load_soft_targets(ctx.path(SOFT_TARGETS_DIR), ctx.path(ENCODED_DIR))
    except MinigptError as exc:
        raise CheckFailed(str(exc), {"folder": str(SOFT_TARGETS_DIR)}) from None
    cfg, summary = ctx.params.soft_targets, soft.summary
    measured = {"used": True, "positions": int(soft.ids.shape[0]), "top": int(soft.ids.shape[1]),
                **{k: summary.get(k) for k in ("order", "folds", "discount", "bits_per_token", "kept_mass")}}
    problems = [f"soft_targets.{key} = {getattr(cfg, key)} but the targets were built with {summary.get(key)}"
                for key in ("order", "folds") if summary.get(key) != getattr(cfg, key)]
    if summary.get("discount") != ctx.params.baselines.discount:
        problems.append(f"baselines.discount = {ctx.params.baselines.discount} but the targets were built with "
                        f"{summary.get('discount')}")
    sums = soft.probs.float().sum(1)
    measured.update(row_sum_min=float(sums.min()), row_sum_max=float(sums.max()),
                    max_id=int(soft.ids.max()), negative=int((soft.probs < 0).sum()))
    if (sums - 1).abs().max() > 1e-2 or measured["negative"]:
        problems.append(f"rows are not distributions (sums {measured['row_sum_min']:.4f} .. "
                        f"{measured['row_sum_max']:.4f}, {measured['negative']} negative probabilities)")
    if measured["max_id"] >= ctx.model_config.vocab_size:
        problems.append(f"token ID {measured['max_id']} >= vocab_size {ctx.model_config.vocab_size}")
    if problems:
        raise CheckFailed("; ".join(problems) + ". Rerun `dvc repro soft_targets`.", measured)
    ctx.soft_targets = soft
    return measured


def _dense(ids: torch.Tensor | np.ndarray, probs: torch.Tensor | np.ndarray, vocab: int) -> np.ndarray:
    ids, probs = np.asarray(ids, dtype=np.int64), np.asarray(probs, dtype=np.float64)
    out = np.zeros((len(ids), vocab))
    np.put_along_axis(out, ids, probs, axis=1)
    return out


def check_soft_targets_held_out(ctx: Context) -> dict:
    """One fold's stored targets against the n-gram recounted here on the other folds alone: equal means no
    position was predicted by counts that include it (or its neighbours in the fold)."""
    if not _used(ctx):
        return UNUSED
    soft, cfg = ctx.soft_targets, ctx.params.soft_targets
    train = ctx.splits["train"].numpy()
    edges = fold_edges(len(train), cfg.folds)
    rng = np.random.default_rng(ctx.params.preflight.seed)
    fold = int(rng.integers(cfg.folds))
    low = max(int(edges[fold]), 1)
    where = np.sort(rng.choice(np.arange(low, edges[fold + 1]), min(HELD_OUT_SAMPLE, edges[fold + 1] - low),
                               replace=False))
    counts = count_ngrams(counted_without(train, edges, fold), soft.summary["vocab_size"], cfg.order)
    ids, probs, _bits, kept = heldout_topk(counts, train, where, soft.summary["top"], ctx.params.baselines.discount)
    vocab = soft.summary["vocab_size"]
    stored = _dense(soft.ids[where].long(), soft.probs[where].float(), vocab)
    expected = _dense(ids, probs, vocab)
    # the mass outside the kept tokens (what model.ngram_expert spreads over the others) is compared too
    difference = np.maximum(np.abs(stored - expected).max(1), np.abs(soft.priors().rest[where].numpy() - (1 - kept)))
    worst = int(difference.argmax())
    true_next = train[where]
    measured = {"fold": fold, "positions_compared": len(where), "max_abs_difference": float(difference.max()),
                "worst_position": int(where[worst]),
                "stored_mass_on_next_token": float(stored[np.arange(len(where)), true_next].mean()),
                "held_out_mass_on_next_token": float(expected[np.arange(len(where)), true_next].mean())}
    if difference.max() > PROBABILITY_TOLERANCE:
        raise CheckFailed(
            f"at {int((difference > PROBABILITY_TOLERANCE).sum())} of {len(where)} positions of fold {fold} the stored "
            f"soft targets differ from the n-gram counted without that fold (by up to {difference.max():.4f} at "
            f"position {measured['worst_position']}; stored mass on the next token "
            f"{measured['stored_mass_on_next_token']:.3f}, held out {measured['held_out_mass_on_next_token']:.3f})",
            measured)
    return measured


def _mass_on(ids: torch.Tensor, probs: torch.Tensor, tokens: torch.Tensor) -> float:
    """Mean over positions of the soft target's probability of `tokens` (0 where not among its kept tokens)."""
    return float((probs * (ids == tokens[..., None])).sum(-1).mean())


def check_soft_targets_aligned(ctx: Context) -> dict:
    """A batch drawn the way the loop draws it: its soft targets must put their mass on its targets (the next
    tokens), not on its inputs or on the token after the target."""
    if not _used(ctx):
        return UNUSED
    block = ctx.model_config.block_size
    inputs, targets, (ids, probs, _rest) = distill.draw_batch(ctx.splits["train"], ctx.params.preflight.batch_size,
                                                              block, ctx.device, ctx.generator(7), ctx.soft_targets)
    on_targets = _mass_on(ids, probs, targets)
    on_inputs = _mass_on(ids, probs, inputs)
    on_next = _mass_on(ids[:, :-1], probs[:, :-1], targets[:, 1:]) if block > 1 else 0.0
    measured = {"mass_on_targets": round(on_targets, 4), "mass_on_inputs": round(on_inputs, 4),
                "mass_on_next_target": round(on_next, 4)}
    if on_targets <= ALIGNED_RATIO * max(on_inputs, on_next):
        raise CheckFailed(
            f"the batch's soft targets put {on_targets:.3f} of their mass on its targets, against {on_inputs:.3f} on "
            f"its inputs and {on_next:.3f} on the token after each target: they are not the targets' distributions",
            measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("soft_targets", check_soft_targets, ("files",),
          "train.distill_alpha > 0: data/soft_targets was built from this encoded train with soft_targets.order, "
          "folds and baselines.discount; every row a distribution over IDs < vocab_size",
          ("soft_targets not rebuilt after encode or a config change: run `dvc repro soft_targets`",
           "targets copied from another run or edited by hand")),
    Check("soft_targets_held_out", check_soft_targets_held_out, ("soft_targets", "token_ids"),
          lambda c: (f"{HELD_OUT_SAMPLE} positions of one fold: stored soft targets (and the mass outside them) equal "
                     f"the n-gram recounted on the other folds alone to within {PROBABILITY_TOLERANCE}"),
          ("a fold counted together with the text it predicts (targets leak the position's own continuation: "
           "far sharper on train than any held-out n-gram)", "rows stored out of order (row t is not position t)",
           "built with other settings than the summary says")),
    Check("soft_targets_aligned", check_soft_targets_aligned, ("soft_targets", "batch_shift"),
          f"a batch drawn as training draws it: the soft targets' mass on its targets > {ALIGNED_RATIO:g} x their mass "
          "on its inputs and on the token after each target",
          ("soft targets looked up at the inputs' positions (starts + t instead of starts + t + 1)",
           "looked up two positions on, or for other windows than the batch's")),
)
