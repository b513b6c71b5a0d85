"""minigpt's dropout (minigpt/model/dropout.py: a CPU mask from 16-bit integers) is dropout: the configured share
dropped independently, the expectation kept, the identity in eval, its mask reproduced by the seed and used by the
backward pass; model.attention_dropout=false takes it off the attention weights only; and the architecture check
catches a dropout that does not rescale or stays on in evaluation."""

import math

import pytest
import torch

from helpers.pipeline_fixture import recompose
from helpers.tiny_models import small_config
from minigpt.model import dropout as dropout_module
from minigpt.model import gpt as model_module
from minigpt.model.dropout import Dropout, drop_probability, keep_mask
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.suite import run_preflight

COUNT = 1 << 20
SIGMAS = 6


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_the_mask_drops_p_of_the_elements_independently(p):
    torch.manual_seed(0)
    keep = keep_mask(torch.Size([COUNT]), p)
    spread = math.sqrt(p * (1 - p) / COUNT)
    assert abs(float((~keep).float().mean()) - p) < SIGMAS * spread
    # neighbours (the four 16-bit halves of one 64-bit draw) are independent: pairs dropped together at p^2
    pairs = (~keep[0::2] & ~keep[1::2]).float().mean()
    assert abs(float(pairs) - p * p) < SIGMAS * math.sqrt(p * p * (1 - p * p) / (COUNT // 2))


def test_dropped_probability_is_p_to_within_2_to_the_minus_17_and_keeps_some_near_1():
    for p in (0.1, 0.123456, 0.3, 0.999):
        assert abs(drop_probability(p) - p) <= 2 ** -17
    assert drop_probability(1 - 1e-9) < 1


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_training_keeps_the_mean_and_eval_is_the_identity(p):
    torch.manual_seed(0)
    layer, x = Dropout(p), torch.ones(COUNT)
    out = layer(x)
    kept = out[out != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / (1 - drop_probability(p)))), "kept values rescaled"
    assert abs(float(out.mean()) - 1) < SIGMAS * math.sqrt(p / (1 - p) / COUNT)
    layer.eval()
    assert torch.equal(layer(x), x)
    assert torch.equal(Dropout(0.0)(x), x), "p = 0 is the identity in training too"


def test_the_seed_reproduces_the_mask_and_the_backward_uses_it():
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(5)
    first = Dropout(0.3)(x)
    torch.manual_seed(5)
    second = Dropout(0.3)(x)
    assert torch.equal(first, second)
    first.sum().backward()
    scale = 1 / (1 - drop_probability(0.3))
    assert torch.allclose(x.grad, (first != 0).float() * scale), "the gradient passes where the mask kept"


def test_bf16_inputs_stay_bf16_and_are_scaled_in_fp32_then_rounded_once():
    torch.manual_seed(0)
    x = torch.randn(10_000).bfloat16()
    out = Dropout(0.1)(x)
    assert out.dtype == torch.bfloat16
    kept = out != 0
    exact = (x.float() * (1 / (1 - drop_probability(0.1)))).bfloat16()
    assert torch.equal(out[kept], exact[kept]), "not x times a bf16-rounded scale"


@pytest.mark.parametrize("attention_dropout,expected", [(True, 0.1), (False, 0.0)])
def test_attention_dropout_false_takes_dropout_off_the_attention_weights_only(monkeypatch, attention_dropout,
                                                                                expected):
    seen = []
    real = model_module.causal_attention
    monkeypatch.setattr(model_module, "causal_attention", lambda q, k, v, p: seen.append(p) or real(q, k, v, p))
    model = MiniGPT(small_config(vocab=23, dropout=0.1, attention_dropout=attention_dropout))
    model.train()
    model(torch.zeros(2, 8, dtype=torch.long))
    assert seen and set(seen) == {expected}
    residual = [m for m in model.modules() if isinstance(m, Dropout)]
    assert len(residual) == 1 + 2 * model.config.num_layers and {m.p for m in residual} == {0.1}


def unscaled(x, p, training):
    """Dropout that zeroes p of its input but forgets to rescale what it keeps."""
    return x * keep_mask(x.shape, p).to(x.dtype) if training and p else x


def always_on(x, p, training):
    """Dropout that ignores evaluation mode."""
    return x * (keep_mask(x.shape, p).to(x.dtype) / (1 - drop_probability(p))) if p else x


@pytest.mark.parametrize("bug,says", [(unscaled, "not rescaled"), (always_on, "still drops in evaluation mode")],
                         ids=["no-rescale", "on-in-eval"])
def test_a_broken_dropout_fails_the_architecture_check(project, monkeypatch, bug, says):
    root, source = project
    monkeypatch.setattr(dropout_module, "dropout", bug)
    report = run_preflight(recompose(root, source, ["model.dropout=0.1"]), root)
    failed = [c for c in report["checks"] if c["status"] == "failed"]
    assert "architecture" in [c["name"] for c in failed]
    assert says in next(c for c in failed if c["name"] == "architecture")["message"]


def test_the_real_dropout_passes_the_architecture_check_and_is_measured(project):
    root, source = project
    params = recompose(root, source, ["model.dropout=0.1", "model.attention_dropout=false"])
    report = run_preflight(params, root)
    architecture = next(c for c in report["checks"] if c["name"] == "architecture")
    assert architecture["status"] == "passed", architecture.get("message")
    layers = architecture["measured"]["dropout"]
    assert len(layers) == 1 + 2 * params.model.num_layers and all(d["identity_in_eval"] for d in layers)
    assert all(abs(d["dropped_share"] - 0.1) < 0.01 for d in layers)
    assert architecture["measured"]["options"]["attention_dropout"] is False

