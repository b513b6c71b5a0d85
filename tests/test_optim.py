import math

import pytest

from helpers.tiny_models import small_config
from minigpt.model.gpt import MiniGPT
from minigpt.train.optim import build_param_groups, make_adamw
from minigpt.train.train_step import cosine_with_warmup


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
