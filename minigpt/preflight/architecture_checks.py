"""Preflight's check that the model built is the model configured (model.position, model.mlp, model.ngram_orders
and the shape):

- architecture: the parameters of each part (token, position and n-gram embeddings, blocks, final LayerNorm,
  head) number what the config's closed-form count says (so a position table under rotary, a layer added or left
  out, a gated MLP of the wrong width each show up as a part of the wrong size), and each block's MLP activation
  computes the configured function of its input (GELU, ReLU squared or SiLU), measured on the check batch; and each
  dropout layer drops the configured share of a probe in training mode (within DROP_SIGMAS binomial standard
  deviations), keeps its mean (the kept values rescaled) and is the identity in evaluation mode.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from minigpt.model.dropout import Dropout
from minigpt.model.gpt import mlp_hidden_width
from minigpt.preflight.checks import Check, CheckFailed
from minigpt.preflight.context import Context

ACTIVATION_ATOL = 1e-5
# dropout probe: this many ones through each dropout layer; its dropped share within DROP_SIGMAS binomial standard
# deviations of model.dropout and its mean within DROP_SIGMAS of 1 (a layer that forgets to rescale is off by p)
DROP_PROBE = 1 << 16
DROP_SIGMAS = 6.0
REFERENCE_ACTIVATIONS = {"gelu": F.gelu, "relu2": lambda x: F.relu(x).square(), "swiglu": F.silu}


def expected_parameters(config) -> dict[str, int]:
    """The parameter count of each part, from the config alone."""
    width, vocab = config.embedding_dim, config.vocab_size
    hidden = mlp_hidden_width(config)
    fc_out = 2 * hidden if config.mlp == "swiglu" else hidden  # a gated MLP's fc holds gate and up
    layer_norm = 2 * width  # weight and bias
    block = (2 * layer_norm
             + 3 * width * width + 3 * width + width * width + width  # qkv, proj (weights and biases)
             + width * fc_out + fc_out + hidden * width + width)  # fc, proj
    return {"tok_emb": vocab * width,
            "pos_emb": config.block_size * width if config.position == "learned" else 0,
            "ngram_emb": max(config.ngram_orders - 1, 0) * config.ngram_buckets * width,
            "blocks": config.num_layers * block,
            "ln_f": layer_norm,
            "head": vocab * width,  # no bias
            **({"expert_gate": width + 1} if config.ngram_expert else {})}


def measured_parameters(model: nn.Module) -> dict[str, int]:
    """The parameter count of each top-level part that has any; a parameter shared with an earlier part counts
    there only."""
    seen, counts = set(), {}
    for name, child in model.named_children():
        fresh = [p for p in child.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        counts[name] = sum(p.numel() for p in fresh)
    return {name: n for name, n in counts.items() if n}


def dropout_problems(model: nn.Module, p: float) -> tuple[list[dict], list[str]]:
    """Each dropout layer's response to a probe of ones: the share it zeroes and the mean it keeps in training mode,
    and whether it is the identity in evaluation mode, against model.dropout = p."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, (nn.Dropout, Dropout))]
    probe, spread = torch.ones(DROP_PROBE), math.sqrt(max(p * (1 - p), 1e-12) / DROP_PROBE)
    measured, problems = [], []
    was_training = model.training
    try:
        for name, layer in layers:
            layer.train()
            with torch.no_grad():
                out = layer(probe)
            layer.eval()
            with torch.no_grad():
                identity = bool(torch.equal(layer(probe), probe))
            share, mean = float((out == 0).float().mean()), float(out.mean())
            measured.append({"layer": name, "dropped_share": round(share, 5), "mean": round(mean, 5),
                             "identity_in_eval": identity})
            if abs(share - p) > DROP_SIGMAS * spread:
                problems.append(f"dropout {name} dropped {share:.4f} of its input, model.dropout = {p:g}")
            if abs(mean - 1) > DROP_SIGMAS * spread / max(1 - p, 1e-12):
                problems.append(f"dropout {name} changed the mean of its input to {mean:.4f} (not rescaled?)")
            if not identity:
                problems.append(f"dropout {name} still drops in evaluation mode")
    finally:
        model.train(was_training)
    return measured, problems


def _activation_errors(model: nn.Module, inputs: torch.Tensor, kind: str) -> list[float]:
    """Per block: the largest |activation(x) - reference(x)| over the check batch."""
    captured, hooks = [], []
    for block in model.blocks:
        hooks.append(block.mlp.act.register_forward_hook(lambda _m, args, out: captured.append((args[0], out))))
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    reference = REFERENCE_ACTIVATIONS[kind]
    return [float((out.float() - reference(x.float())).abs().max()) for x, out in captured]


def check_architecture(ctx: Context) -> dict:
    model, config = ctx.model, ctx.model_config
    expected, measured_counts = expected_parameters(config), measured_parameters(model)
    measured = {"expected_parameters": expected, "parameters": measured_counts,
                "options": {k: getattr(config, k) for k in ("position", "qk_norm", "mlp", "attention_dropout",
                                                                  "attention_precision", "ngram_orders",
                                                                  "ngram_buckets", "ngram_expert")}}
    problems = [f"{part}: {measured_counts.get(part, 0):,} parameters, the config says {want:,}"
                for part, want in expected.items() if measured_counts.get(part, 0) != want]
    problems += [f"{part}: {n:,} parameters in a part the config does not have"
                 for part, n in measured_counts.items() if part not in expected]
    if all(hasattr(block, "mlp") and hasattr(block.mlp, "act") for block in getattr(model, "blocks", [])):
        model.eval()
        errors = _activation_errors(model, ctx.batch[0][:2], config.mlp)
        measured["activation_max_abs_error"] = errors
        wrong = [i for i, error in enumerate(errors) if not error <= ACTIVATION_ATOL]
        if wrong:
            problems.append(f"the MLP activation of block(s) {', '.join(map(str, wrong))} is not model.mlp = "
                            f"'{config.mlp}' (largest error {max(errors[i] for i in wrong):.3g})")
    else:
        measured["activation_max_abs_error"] = None
    measured["dropout"], dropping = dropout_problems(model, config.dropout)
    problems += dropping
    if problems:
        raise CheckFailed("the model built is not the model configured: " + "; ".join(problems), measured)
    return measured


CHECKS: tuple[Check, ...] = (
    Check("architecture", check_architecture, ("forward_shapes",),
          "each part's parameter count = the config's closed form; each block's MLP activation = model.mlp's "
          f"function of its input (atol {ACTIVATION_ATOL:g}); each dropout layer drops model.dropout of a probe, "
          f"keeps its mean (both within {DROP_SIGMAS:g} binomial s.d.) and is the identity in eval mode",
          ("an option read but not applied (a position table under rotary)", "a layer added to the model or left out",
           "a gated MLP of the wrong width", "the wrong activation for model.mlp",
           "a dropout that does not rescale what it keeps, or stays on in evaluation")),
)
