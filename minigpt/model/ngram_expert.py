"""model.ngram_expert: the next-token distribution mixed with a counted n-gram's by a learned gate,

    p(w) = g p_net(w) + (1 - g) q(w),    g = sigmoid(a . h + b)

where h is the position's final hidden state (after the last LayerNorm) and q the Kneser-Ney n-gram of stage
soft_targets (minigpt.data.soft_target_files): cross-fitted at train positions, so the gate never learns to trust
an n-gram that saw the position's own continuation; counted on all of train at val and test, and at generation.
a and b start at zero: every position starts at g = 0.5.

q arrives as a Prior: the n-gram's `top` most likely tokens with their probabilities renormalised over them, and the
mass `rest` it puts on every other token, spread evenly over those. The mixture's log-probabilities are returned
as the model's logits: softmax(log p) = p, so every consumer of logits (cross-entropy, sampling) reads the mixture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# (ids [..., top] long, probs [..., top] float32 renormalised over the kept tokens, rest [...] float32: the mass
# outside them)
Prior = tuple[torch.Tensor, torch.Tensor, torch.Tensor]

# the smallest mass left to the tokens outside the kept ones: a token the n-gram never predicts stays finite
MIN_REST = 1e-4


def prior_log_probs(prior: Prior, vocab_size: int) -> torch.Tensor:
    """log q [..., vocab_size] (fp32): the kept tokens at their share of 1 - rest, the others at rest / (V - top)."""
    ids, probs, rest = prior
    top = ids.shape[-1]
    rest = rest.float().clamp(min=MIN_REST if top < vocab_size else 0.0, max=1.0)
    others = torch.log(rest / max(vocab_size - top, 1))
    log_q = others[..., None].expand(*ids.shape[:-1], vocab_size).clone()
    kept = probs.float() * (1 - rest)[..., None]
    return log_q.scatter_(-1, ids, torch.log(kept.clamp(min=1e-30)))


def mixed_log_probs(logits: torch.Tensor, gate_logit: torch.Tensor, prior: Prior) -> torch.Tensor:
    """log(g softmax(logits) + (1 - g) q) [..., V] in fp32, g = sigmoid(gate_logit [..., 1])."""
    gate_logit = gate_logit.float()
    return torch.logaddexp(F.logsigmoid(gate_logit) + F.log_softmax(logits.float(), dim=-1),
                           F.logsigmoid(-gate_logit) + prior_log_probs(prior, logits.size(-1)))
