"""Preflight checks of the model before it trains: output shapes, the initial loss near log(V), causality
(no position sees its future), gradients reaching every parameter, and one step of the run's training step
changing every parameter."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn as nn

from minigpt.model import batch_loss
from minigpt.model.nonfinite import NonFiniteTracker
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context
from minigpt.train import train_step

CAUSAL_ATOL = 1e-5
CAUSAL_GRAD_ATOL = 1e-10


def check_forward_shapes(ctx: Context) -> dict:
    ctx.seed_all(2)
    model = ctx.model_factory(ctx.model_config).to(ctx.device)
    ctx.model = model
    inputs, targets = ctx.batch
    model.eval()
    with torch.no_grad(), NonFiniteTracker(model) as tracker:
        logits, loss = model(inputs, targets)
    expected = [inputs.shape[0], inputs.shape[1], ctx.model_config.vocab_size]
    measured = {"logits_shape": list(logits.shape), "expected_shape": expected, "loss_shape": list(loss.shape),
                "loss": float(loss), "parameters": sum(p.numel() for p in model.parameters())}
    if list(logits.shape) != expected:
        raise CheckFailed(f"logits shape {list(logits.shape)}, expected {expected}", measured)
    if loss.dim() != 0:
        raise CheckFailed(f"loss is not a scalar (shape {list(loss.shape)})", measured)
    if not torch.isfinite(loss):
        measured["first_nonfinite_module"] = tracker.first
        raise CheckFailed(f"loss is {float(loss)}; first non-finite output in module '{tracker.first}'", measured)
    return measured


def check_initial_loss(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    with torch.no_grad():
        _, loss = model(*ctx.batch)
    expected = math.log(ctx.model_config.vocab_size)
    tol = ctx.params.preflight.initial_loss_tolerance
    loss = float(loss)
    ctx.summary.update(initial_loss=loss, expected_initial_loss=expected)
    measured = {"initial_loss": round(loss, 5), "expected_log_v": round(expected, 5),
                "difference": round(loss - expected, 5)}
    if loss > expected + tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far ABOVE log(V) = {expected:.4f}: the model starts confidently wrong "
            "(extreme initial logits / too-large init, targets that do not match the inputs, or a loss on wrong IDs)",
            measured,
        )
    if loss < expected - tol:
        raise CheckFailed(
            f"initial loss {loss:.4f} is far BELOW log(V) = {expected:.4f}: an untrained model cannot do better than "
            "chance, so it sees the answer (future tokens visible through the mask, unshifted targets with a copy "
            "path, or weights loaded instead of a fresh init)",
            measured,
        )
    return measured


def check_causal_independence(ctx: Context) -> dict:
    model = ctx.model
    model.eval()
    inputs = ctx.batch[0][:2]
    time_steps = inputs.shape[1]
    if time_steps < 2:
        return {"skipped_reason": "block_size 1 has no future"}
    cut = time_steps // 2
    changed = inputs.clone()
    # a different suffix: rotate every future ID (guaranteed to differ when V > 1)
    changed[:, cut:] = (changed[:, cut:] + 1) % ctx.model_config.vocab_size
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(changed)
    prefix_diff = float((a[:, :cut] - b[:, :cut]).abs().max())
    suffix_diff = float((a[:, cut:] - b[:, cut:]).abs().max())

    # gradient proof: d(logits at t) / d(input embedding at t' > t) must be exactly zero
    captured = {}

    def keep_grad(_module, _inputs, output):
        # replace the embedding output by a leaf, so its gradient exists even if parameters are frozen
        leaf = output.detach().requires_grad_(True)
        captured["emb"] = leaf
        return leaf

    embedding = _token_embedding(model)
    handle = embedding.register_forward_hook(keep_grad)
    try:
        model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            logits, _ = model(inputs)
            t = cut - 1
            logits[:, t].float().pow(2).sum().backward()
    finally:
        handle.remove()
    grad = captured["emb"].grad
    if grad is None:
        raise CheckFailed(
            f"no gradient reaches the token embedding's output ('{_module_name(model, embedding)}') from the logits: "
            "the residual stream is cut from the embeddings (a .detach(), a no_grad block or a re-created tensor "
            "between them), so the model cannot learn from its inputs",
            {"position": t, "embedding_output_grad": None},
        )
    future_grad = float(grad[:, t + 1:].abs().max())
    past_grad = float(grad[:, : t + 1].abs().max())
    model.zero_grad(set_to_none=True)
    measured = {
        "prefix_max_abs_diff": prefix_diff,
        "suffix_max_abs_diff": suffix_diff,
        "position": t,
        "future_grad_max": future_grad,
        "past_grad_max": past_grad,
    }
    if prefix_diff > CAUSAL_ATOL or future_grad > CAUSAL_GRAD_ATOL:
        raise CheckFailed(
            f"logits before position {cut} depend on later tokens (prefix diff {prefix_diff:.2e}, "
            f"d logits[{t}] / d embedding[>{t}] = {future_grad:.2e}): the causal mask is missing or wrong",
            measured,
        )
    if past_grad == 0.0:
        raise CheckFailed("no gradient reaches even the past embeddings: the check is not measuring anything", measured)
    return measured


def _module_name(model: nn.Module, module: nn.Module) -> str:
    return next((name for name, m in model.named_modules() if m is module), type(module).__name__)


def _token_embedding(model: nn.Module) -> nn.Module:
    if hasattr(model, "tok_emb"):
        return model.tok_emb
    return next(m for m in model.modules() if isinstance(m, nn.Embedding))


def check_gradients(ctx: Context) -> dict:
    """One backward pass of the run's loss (its precision, through the shared step's forward): every parameter
    trains (the configuration freezes none) and gets a finite, non-zero gradient."""
    model = ctx.model
    model.train()
    model.zero_grad(set_to_none=True)
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [n for n, p in named if not p.requires_grad]
    measured: dict[str, Any] = {"trainable": len(trainable), "frozen": len(frozen), "frozen_names": frozen[:50],
                                "precision": ctx.params.train.precision}
    ctx.summary["frozen_parameters"] = frozen
    if not trainable:
        ctx.summary.update(grad_norm=0.0, missing_gradients=[n for n, _ in named])
        raise CheckFailed("no parameter requires grad: every parameter is frozen", measured)
    ctx.seed_all(3)
    with NonFiniteTracker(model) as tracker:
        inputs, targets, prior = ctx.batch_with_prior()  # under model.ngram_expert the gate's gradient too
        loss = batch_loss.calc_loss_batch(model, inputs, targets, ctx.params.train.precision, prior)
        loss.backward()
    missing = [n for n, p in trainable if p.grad is None]
    nonfinite = [n for n, p in trainable if p.grad is not None and not torch.isfinite(p.grad).all()]
    all_zero = [n for n, p in trainable if p.grad is not None and n not in nonfinite and not p.grad.any()]
    norms = {n: float(p.grad.norm()) for n, p in trainable if p.grad is not None}
    global_norm = math.sqrt(sum(v * v for v in norms.values()))
    measured.update(global_norm=global_norm, missing=missing, nonfinite=nonfinite, all_zero=all_zero,
                    per_parameter_norms=norms)
    if tracker.first:
        measured["first_nonfinite_module"] = tracker.first
    ctx.summary.update(grad_norm=global_norm, missing_gradients=missing)
    model.zero_grad(set_to_none=True)
    problems = []
    if frozen:
        # nothing in the configuration freezes a parameter, so a frozen one is a bug that training would hide
        problems.append(f"frozen parameters (requires_grad=False) that the run would never train: "
                        f"{', '.join(frozen[:12])}{' …' if len(frozen) > 12 else ''}")
    if missing:
        problems.append(f"no gradient for {', '.join(missing)} (defined but not used in forward, or detached)")
    if nonfinite:
        problems.append(f"non-finite gradients in {', '.join(nonfinite)} (first non-finite module: {tracker.first})")
    if all_zero:
        problems.append(f"all-zero gradients for {', '.join(all_zero)}")
    if problems:
        raise CheckFailed("; ".join(problems), measured)
    return measured


def check_optimizer_update(ctx: Context) -> dict:
    """One step of the run's optimizer through the shared training step changes every parameter."""
    model = copy.deepcopy(ctx.model)
    model.train()
    train = ctx.params.train
    try:
        optimizer = train_step.make_optimizer(model, train)
    except ValueError as exc:
        ctx.summary["param_update_max"] = 0.0
        raise CheckFailed(str(exc), {"max_change": 0.0}) from None
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ctx.seed_all(4)
    inputs, targets, prior = ctx.batch_with_prior()
    result = train_step.training_step(model, optimizer, inputs, targets, train.lr, train.precision, train.grad_clip,
                                      **({} if prior is None else {"prior": prior}))
    changes = {n: float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()}
    unchanged = [n for n, c in changes.items() if c == 0.0]
    max_change = max(changes.values())
    ctx.summary["param_update_max"] = max_change
    measured = {"lr": train.lr, "loss": result.loss, "grad_norm": result.grad_norm, "stepped": result.stepped,
                "max_change": max_change, "unchanged": unchanged}
    if not result.stepped:
        raise CheckFailed(f"the step was skipped: loss {result.loss}, gradient norm {result.grad_norm}", measured)
    if max_change == 0.0:
        raise CheckFailed("one training step changed no parameter", measured)
    if unchanged:
        raise CheckFailed(f"one training step left {', '.join(unchanged)} unchanged", measured)
    return measured



CHECKS: tuple[Check, ...] = (
    Check("forward_shapes", check_forward_shapes, ("batch_shift",), "logits [B, T, V]; loss a finite scalar",
          ("wrong reshape/transpose in attention", "head sized for another vocabulary", "NaN from a bad init or mask")),
    Check("initial_loss", check_initial_loss, ("forward_shapes",),
          lambda c: f"|loss - log(V)| <= {c.params.preflight.initial_loss_tolerance} nats",
          ("above: extreme initial logits (init too large), targets not matching inputs, loss on wrong IDs",
           "below: future tokens visible (causal mask), unshifted targets, loaded weights instead of a fresh init")),
    Check("causal_independence", check_causal_independence, ("forward_shapes",),
          f"prefix logits unchanged by a new suffix (atol {CAUSAL_ATOL}); d logits[t] / d emb[t' > t] <= "
          f"{CAUSAL_GRAD_ATOL}",
          ("attention without causal masking (is_causal / mask missing)",
           "mask built the wrong way round or offset by one",
           "a layer mixing positions (e.g. normalisation over time)")),
    Check("gradients", check_gradients, ("forward_shapes",),
          "no frozen parameter; every parameter gets a finite, non-zero gradient (the run's precision)",
          ("a layer defined but not used in forward", "parameters frozen (requires_grad=False)",
           "a tensor detached from the graph (.detach(), .item(), numpy round trip)", "NaN/Inf from an overflow")),
    Check("optimizer_update", check_optimizer_update, ("forward_shapes",),
          "one step of the run's training step and optimizer changes every parameter",
          ("all parameters frozen", "optimizer built over the wrong parameter list", "learning rate 0",
           "zero_grad called between backward and step")),
)
