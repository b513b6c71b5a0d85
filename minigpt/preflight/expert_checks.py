"""Preflight's checks of model.ngram_expert (minigpt.model.ngram_expert): the n-gram priors that evaluation and the
in-run evaluations mix in at val and test are the n-gram counted on train alone, each at its own position; and a
new model's gate starts at an even mixture of the network and the n-gram. (At train positions the mixed-in
n-gram is the soft targets themselves: soft_targets_held_out and soft_targets_aligned prove them.)"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from minigpt.core.errors import MinigptError
from minigpt.core.paths import ENCODED_DIR, SOFT_TARGETS_DIR
from minigpt.data.soft_target_files import HELDOUT_SPLITS, load_heldout_priors
from minigpt.data.soft_targets import count_ngrams, heldout_topk
from minigpt.model.ngram_expert import prior_log_probs
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train import distill

SAMPLE = 256  # positions of each held-out split recounted
PROBABILITY_TOLERANCE = 2e-3  # stored in fp16: a probability <= 1 is off by at most 4.9e-4
EVEN_TOLERANCE = 1e-6
UNUSED = {"used": False, "why": "model.ngram_expert is false: the output is the network's alone"}


def _used(ctx: Context) -> bool:
    return ctx.params.model.ngram_expert


def _dense(prior, vocab: int) -> np.ndarray:
    return prior_log_probs(prior, vocab).exp().double().numpy()


def check_ngram_priors(ctx: Context) -> dict:
    """At sampled positions of val and test, the stored priors against the n-gram recounted here on train alone:
    equal means every position holds its own distribution (not its neighbour's) and val and test were never
    counted."""
    if not _used(ctx):
        return UNUSED
    try:
        priors = load_heldout_priors(ctx.path(SOFT_TARGETS_DIR), ctx.path(ENCODED_DIR))
    except MinigptError as exc:
        raise CheckFailed(str(exc), {"folder": str(SOFT_TARGETS_DIR)}) from None
    summary, cfg = ctx.soft_targets.summary, ctx.params.soft_targets
    vocab, top = summary["vocab_size"], summary["top"]
    counts = count_ngrams(ctx.splits["train"].numpy(), vocab, cfg.order)
    rng = np.random.default_rng(ctx.params.preflight.seed)
    measured, problems = {"order": cfg.order, "top": top}, []
    for split in HELDOUT_SPLITS:
        ids = ctx.splits[split].numpy()
        where = np.sort(rng.choice(np.arange(1, len(ids)), min(SAMPLE, len(ids) - 1), replace=False))
        top_ids, probs, _bits, kept = heldout_topk(counts, ids, where, top, ctx.params.baselines.discount)
        recounted = (torch.from_numpy(top_ids), torch.from_numpy(probs), torch.from_numpy(1 - kept).float())
        positions = torch.from_numpy(where)
        stored = _dense(priors[split].at(positions), vocab)
        expected = _dense(recounted, vocab)
        difference = np.abs(stored - expected).max(1)
        rows = np.arange(len(where))
        measured[split] = {"positions_compared": len(where), "max_abs_difference": float(difference.max()),
                           "stored_mass_on_targets": float(stored[rows, ids[where]].mean()),
                           "recounted_mass_on_targets": float(expected[rows, ids[where]].mean()),
                           "stored_mass_on_inputs": float(stored[rows, ids[where - 1]].mean())}
        if difference.max() > PROBABILITY_TOLERANCE:
            problems.append(
                f"{split}: at {int((difference > PROBABILITY_TOLERANCE).sum())} of {len(where)} positions the stored "
                f"prior differs from the n-gram counted on train alone (by up to {difference.max():.4f}; mass on the "
                f"targets stored {measured[split]['stored_mass_on_targets']:.3f}, recounted "
                f"{measured[split]['recounted_mass_on_targets']:.3f}, stored on the inputs "
                f"{measured[split]['stored_mass_on_inputs']:.3f})")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_expert_gate_even(ctx: Context) -> dict:
    """A new model's output on a train batch, mixed with the batch's soft targets: exactly half the network's
    distribution and half the n-gram's at every position (the gate starts at zero)."""
    if not _used(ctx):
        return UNUSED
    ctx.seed_all(11)
    model = ctx.model_factory(ctx.model_config).to(ctx.device).eval()
    inputs, _targets, prior = distill.draw_batch(ctx.splits["train"], ctx.params.preflight.batch_size,
                                                 ctx.model_config.block_size, ctx.device, ctx.generator(11),
                                                 ctx.soft_targets)
    with torch.no_grad():
        network, _ = model(inputs)
        mixed, _ = model(inputs, prior=prior)
    even = 0.5 * F.softmax(network.float(), -1) + 0.5 * prior_log_probs(prior, network.size(-1)).exp()
    gap = float((mixed.float().exp() - even).abs().max())
    measured = {"max_abs_difference": gap, "mixed_sums_to": float(mixed.float().exp().sum(-1).mean())}
    if gap > EVEN_TOLERANCE:
        raise CheckFailed(f"a new model's mixture differs from half the network and half the n-gram by up to "
                          f"{gap:.3g}: the gate does not start at zero (or the mixture is not p = g p_net + (1 - g) q)",
                          measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("ngram_priors", check_ngram_priors, ("soft_targets", "token_ids"),
          lambda c: (f"model.ngram_expert: at {SAMPLE} positions of val and of test, the stored priors equal the "
                     f"n-gram recounted on train alone to within {PROBABILITY_TOLERANCE}"),
          ("priors stored one position off (each holds its neighbour's distribution)",
           "val or test counted into the n-gram they are scored with", "priors not rebuilt after encode")),
    Check("expert_gate_even", check_expert_gate_even, ("soft_targets", "forward_shapes"),
          f"model.ngram_expert: a new model's mixture is half the network and half the n-gram at every position "
          f"(to within {EVEN_TOLERANCE:g})",
          ("the gate initialised away from zero (the run starts trusting one side)",
           "the mixture computed in another form than g p_net + (1 - g) q")),
)
