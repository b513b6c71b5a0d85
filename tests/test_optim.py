import math

import pytest
import torch

from helpers.tiny_models import small_config
from minigpt.model.gpt import MiniGPT
from minigpt.train import muon as muon_module
from minigpt.train.muon import Muon, newton_schulz
from minigpt.train.optim import build_param_groups, make_adamw, make_optimizer
from minigpt.train.train_step import NESTED_PHASES, PHASES, cosine_with_warmup, training_step


def test_decay_split_puts_every_parameter_in_exactly_one_group():
    model = MiniGPT(small_config(40))
    decay, no_decay = build_param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    kept = {names[id(p)] for p in no_decay["params"]}
    assert decayed.isdisjoint(kept) and decayed | kept == set(names.values())
    assert {"tok_emb.weight", "pos_emb.weight", "head.weight", "blocks.0.attn.qkv.weight",
            "blocks.1.mlp.fc.weight"} <= decayed
    assert {"blocks.0.attn.qkv.bias", "blocks.0.ln1.weight", "blocks.0.ln1.bias", "ln_f.weight"} <= kept
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_frozen_parameters_are_left_out_and_all_frozen_is_an_error():
    model = MiniGPT(small_config(40, num_layers=1))
    model.tok_emb.weight.requires_grad_(False)
    groups = build_param_groups(model, 0.1)
    assert all(p is not model.tok_emb.weight for g in groups for p in g["params"])
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        make_adamw(model, 1e-3, 0.1)


def test_cosine_with_warmup_at_its_boundaries():
    lr = lambda s: cosine_with_warmup(s, warmup_steps=10, total_steps=110, max_lr=1e-3)  # noqa: E731
    assert lr(0) == 0.0
    assert lr(5) == pytest.approx(5e-4)
    assert lr(10) == pytest.approx(1e-3)
    assert lr(60) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr(110) == pytest.approx(1e-4)
    assert lr(500) == pytest.approx(1e-4)
    assert cosine_with_warmup(0, 0, 10, 1.0, 0.0) == 1.0
    assert cosine_with_warmup(10, 0, 10, 1.0, 0.0) == 0.0
    values = [lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))
    assert not math.isnan(cosine_with_warmup(5, 10, 5, 1.0))


def test_time_budget_clock_drives_the_decay_when_it_is_further_along():
    def lr(s, f):
        return cosine_with_warmup(s, warmup_steps=10, total_steps=1010, max_lr=1e-3, time_fraction=f)

    assert lr(5, 0.9) == pytest.approx(5e-4), "warmup stays in steps"
    assert lr(20, 0.5) == pytest.approx(1e-4 + 0.5 * 9e-4), "half the budget spent: half-way down the cosine"
    assert lr(20, 1.0) == pytest.approx(1e-4) and lr(20, 3.0) == pytest.approx(1e-4)
    assert lr(510, 0.1) == pytest.approx(lr(510, 0.0)), "the step count wins when it is further along"


def muon_steps(optimizer_of, precision=None, steps=4, by_shape=True):
    """Four Muon steps on the same seeded matrices (two of one shape) and gradients: the weights after them."""
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((48, 16), (16, 48), (32, 32), (48, 16))]
    optimizer = optimizer_of(weights)
    if precision is not None:
        optimizer.precision, optimizer.by_shape = precision, by_shape
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for w in weights:
            w.grad = torch.randn(w.shape, generator=gen)
        optimizer.step()
    return weights, optimizer


def test_muon_in_bf16_one_matrix_at_a_time_is_torchs_muon_bit_for_bit_and_in_fp32_orthogonalises_in_fp32(
        monkeypatch):
    kwargs = {"lr": 0.02, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    theirs, their_optimizer = muon_steps(lambda w: torch.optim.Muon(w, **kwargs))
    ours, our_optimizer = muon_steps(lambda w: Muon(w, **kwargs), "bf16", by_shape=False)
    assert all(torch.equal(a, b) for a, b in zip(theirs, ours)), "one matrix at a time in bf16 is torch's update"
    assert all(torch.equal(a, b) for a, b in zip(
        [s["momentum_buffer"] for s in their_optimizer.state.values()],
        [s["momentum_buffer"] for s in our_optimizer.state.values()])), "and the same state (checkpoints load)"

    seen = []
    real = muon_module.newton_schulz
    monkeypatch.setattr(muon_module, "newton_schulz", lambda *a: seen.append(a[-1]) or real(*a))
    fp32, _ = muon_steps(lambda w: Muon(w, **kwargs), "fp32")
    assert set(seen) == {torch.float32}
    assert all(not torch.equal(a, b) and torch.allclose(a, b, atol=0.02) for a, b in zip(fp32, ours))


def test_newton_schulz_in_fp32_gives_singular_values_near_one_in_either_orientation():
    g = torch.randn(64, 24, generator=torch.Generator().manual_seed(3))
    for matrix in (g, g.T):
        ortho = newton_schulz(matrix, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float32)
        assert ortho.dtype == torch.float32 and ortho.shape == matrix.shape
        singular = torch.linalg.svdvals(ortho)
        assert 0.5 < float(singular.min()) and float(singular.max()) < 1.5, singular


COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # torch.optim.Muon's


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 0.02)])
def test_newton_schulz_of_a_stack_is_each_matrix_own_up_to_rounding(dtype, tolerance):
    gen = torch.Generator().manual_seed(5)
    scales = torch.tensor([1e-3, 1.0, 30.0])[:, None, None]  # one norm for the whole stack would shrink the first
    for shape in ((3, 48, 16), (3, 16, 48)):
        stack = torch.randn(*shape, generator=gen) * scales
        together = newton_schulz(stack, COEFFICIENTS, 5, 1e-7, dtype)
        alone = torch.stack([newton_schulz(m, COEFFICIENTS, 5, 1e-7, dtype) for m in stack])
        assert together.shape == stack.shape and together.dtype == dtype
        assert torch.allclose(together.float(), alone.float(), atol=tolerance), (together - alone).abs().max()


@pytest.mark.parametrize("precision, tolerance", [("fp32", 1e-6), ("bf16", 2e-3)])
def test_muon_orthogonalises_same_shaped_matrices_together_with_the_same_result(monkeypatch, precision, tolerance):
    kwargs = {"lr": 0.02, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}

    def steps(by_shape):
        torch.manual_seed(0)
        weights = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((48, 16), (48, 16), (16, 48), (48, 16))]
        optimizer = Muon(weights, **kwargs)
        optimizer.precision, optimizer.by_shape = precision, by_shape
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            for w in weights:
                w.grad = torch.randn(w.shape, generator=gen)
            optimizer.step()
        return weights

    shapes = []
    real = muon_module.newton_schulz
    monkeypatch.setattr(muon_module, "newton_schulz", lambda u, *a: shapes.append(tuple(u.shape)) or real(u, *a))
    together = steps(by_shape=True)
    assert set(shapes) == {(3, 48, 16), (16, 48)}, "the three 48x16 matrices in one call, the 16x48 alone"
    shapes.clear()
    alone = steps(by_shape=False)
    assert set(shapes) == {(48, 16), (16, 48)}
    assert all(torch.allclose(a, b, atol=tolerance) for a, b in zip(together, alone))


def test_the_training_step_orthogonalises_in_its_own_precision():
    model = MiniGPT(small_config(40))
    optimizer = make_optimizer(model, "muon", 1e-3, 0.1)
    inputs = torch.randint(0, 40, (2, 8))
    for precision in ("fp32", "bf16"):
        training_step(model, optimizer, inputs, inputs, 1e-3, precision, 1.0)
        assert optimizer.muon.precision == precision
    with pytest.raises(ValueError, match="match_rms_adamw"):
        Muon([torch.nn.Parameter(torch.ones(2, 2))], lr=0.1)


def test_a_profiled_training_step_names_its_phases_with_the_orthogonalisation_inside_the_optimizer():
    model = MiniGPT(small_config(40))
    optimizer = make_optimizer(model, "muon", 1e-3, 0.1)
    inputs = torch.randint(0, 40, (2, 8))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        training_step(model, optimizer, inputs, inputs, 1e-3, "fp32", 1.0)
    spans = {e.name: e.time_range for e in prof.events() if e.name in PHASES.values()}
    assert set(spans) == set(PHASES.values())
    # the outermost phases one after the other, never overlapping (profile_step adds them up)
    outermost = [spans[PHASES[p]] for p in ("forward", "backward", "clip", "optimizer")]
    assert all(a.end <= b.start for a, b in zip(outermost, outermost[1:]))
    assert set(PHASES) - set(NESTED_PHASES) == {"forward", "backward", "clip", "optimizer"}
    outer, inner = spans[PHASES[NESTED_PHASES["newton_schulz"]]], spans[PHASES["newton_schulz"]]
    assert outer.start <= inner.start and inner.end <= outer.end
    # a step skipped for a non-finite loss never enters the optimizer's range
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = training_step(model, optimizer, inputs, inputs, 1e-3, "fp32", 1.0)
    names = {e.name for e in prof.events()}
    assert not result.stepped
    assert PHASES["forward"] in names and PHASES["optimizer"] not in names
