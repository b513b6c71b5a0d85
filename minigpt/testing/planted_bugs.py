"""Bugs planted in the training code on purpose, shared by the tests and benchmarks/preflight_false_alarms.py:
each is a plausible mistake in the real step or schedule that preflight must refuse by name."""

import torch

from minigpt.model import batch_loss, ngram_embedding
from minigpt.train import optim, train_step
from minigpt.train.weight_average import WeightAverage

REAL_COSINE = train_step.cosine_with_warmup


def zero_grad_between_backward_and_step(model, optimizer, inputs, targets, lr, precision, grad_clip, clip_params=None,
                                        soft=None, distill_alpha=0.0, prior=None):
    """The real step with zero_grad moved after backward: the optimizer steps on no gradient (updates never land)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = batch_loss.calc_loss_batch(model, inputs, targets, precision, prior)  # (the soft-target term left out)
    loss.backward()
    optimizer.zero_grad(set_to_none=True)
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
    optimizer.step()
    return train_step.StepResult(float(loss.detach()), norm, lr, True)


def lr_zero_after_warmup(step, warmup_steps, total_steps, max_lr, min_lr=None, time_fraction=0.0):
    """The schedule's cosine part returning 0 (e.g. a progress computed past 1 with min_lr 0)."""
    return REAL_COSINE(step, warmup_steps, total_steps, max_lr, min_lr, time_fraction) if step < warmup_steps else 0.0


def lr_tail_at_zero(step, warmup_steps, total_steps, max_lr, min_lr=None, time_fraction=0.0):
    """The schedule's last 10% of steps at 0 instead of min_lr (a tail the rehearsal's first 60 steps never reach)."""
    if step >= 0.9 * total_steps:
        return 0.0
    return REAL_COSINE(step, warmup_steps, total_steps, max_lr, min_lr, time_fraction)


REAL_GROUPS = optim.build_param_groups


def layernorm_weights_decayed(model, weight_decay):
    """The decay split by name, forgetting that LayerNorm weights are not matrices: they land in the decay group."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and n.endswith("bias")]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def clip_over_the_last_layer_only(model, optimizer, inputs, targets, lr, precision, grad_clip, clip_params=None,
                                  soft=None, distill_alpha=0.0, prior=None):
    """The real step, clipping (and measuring) only the last parameter's gradients (the head's; the n-gram expert's
    gate bias under model.ngram_expert) instead of the whole model's."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = batch_loss.calc_loss_batch(model, inputs, targets, precision, prior)  # (the soft-target term left out)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(list(model.parameters())[-1:], grad_clip))
    optimizer.step()
    return train_step.StepResult(float(loss.detach()), norm, lr, True)


def rotate_half_over_time(x, cos, sin):
    """Rotary's rotate-half written over the wrong axis (positions instead of the head's width): each position
    is turned with the vector of a position half a window away, later ones included (a leak from the future)."""
    half = x.shape[-2] // 2
    rotated = torch.cat([-x[..., half:, :], x[..., :half, :]], dim=-2)
    cos, sin = torch.cat([cos, cos], dim=-1).to(x.dtype), torch.cat([sin, sin], dim=-1).to(x.dtype)
    return x * cos + rotated * sin


def qk_norm_over_positions(x):
    """QK-normalisation over the positions of each feature instead of over the head's width: every position's
    query and key are scaled by statistics of the whole window, later positions included."""
    return torch.nn.functional.rms_norm(x.transpose(-1, -2), (x.shape[-2],)).transpose(-1, -2)


REAL_NGRAM_ROWS = ngram_embedding.ngram_rows


def ngram_rows_one_token_late(ids, orders, buckets, pad_id, history=None):
    """The n-gram hash fed the inputs shifted left by one (the n-grams of the targets, the usual off-by-one of a
    hand-built shift): each position's rows include the token it is asked to predict."""
    ahead = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], pad_id)], dim=1)
    return REAL_NGRAM_ROWS(ahead, orders, buckets, pad_id, history)


def ngram_lookup_never_added(self, ids, history=None):
    """The n-gram table built (model.ngram_orders read) but its lookup replaced by zeros: the option trains nothing."""
    return torch.zeros(*ids.shape, self.table.embedding_dim, device=ids.device)


REAL_MUON_PARAMETERS = optim.muon_parameters


def muon_gets_the_embedding(model):
    """Muon's parameter list built from every 2-D parameter (the usual one-liner): the token embedding and the
    head go to Muon too, which orthogonalises a lookup table's update (rows the batch never used move)."""
    return [p for p in model.parameters() if p.requires_grad and p.dim() == 2]


def fp32_attention_without_the_mask(attention, q, k, v, dropout_p):
    """attention_precision=fp32 written as its own fp32 attention call that forgets the causal mask (the real
    in_fp32 casts and hands the model's causal_attention the work): every position attends to the whole window."""
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=dropout_p)
    return out.to(q.dtype)


_REAL_AVERAGE_INIT = WeightAverage.__init__


def average_without_a_copy(self, trained, decay):
    """WeightAverage.__init__ that keeps the trained model itself: the 'average' is just the trained weights."""
    _REAL_AVERAGE_INIT(self, trained, decay)
    self.model = trained


def average_weighted_the_wrong_way(self, trained):
    """WeightAverage.update with the decay on the new weights: the average forgets its past at every step."""
    self.updates += 1
    kept = min(self.decay, self.updates / (self.updates + 9))
    averaged, current = self._pairs(trained)
    torch._foreach_lerp_(averaged, current, kept)
