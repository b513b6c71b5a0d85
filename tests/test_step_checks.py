"""decay_split, lr_schedule and clipping_contract: the correct step passes; each planted bug fails its own check."""

import numpy as np
import pytest

from helpers.pipeline_fixture import recompose
from minigpt.preflight import step_checks
from minigpt.preflight.checks import format_table
from minigpt.preflight.suite import run_preflight
from minigpt.testing.planted_bugs import clip_over_the_last_layer_only, layernorm_weights_decayed, lr_tail_at_zero
from minigpt.train import optim, train_step

STEP_CHECKS = ("decay_split", "lr_schedule", "clipping_contract")


def check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


def failed(report):
    return [c["name"] for c in report["checks"] if c["status"] == "failed"]


@pytest.mark.parametrize("overrides", [[], ["train.max_seconds=30"], ["train.min_lr=0.0", "train.warmup_steps=0"],
                                       ["train.precision=bf16", "train.weight_decay=0.0"]])
def test_the_correct_step_passes_the_contract_checks(project, overrides):
    root, source = project
    params = recompose(root, source, overrides)
    report = run_preflight(params, root)
    assert report["passed"], format_table(report["checks"])
    split = check(report, "decay_split")["measured"]
    assert "blocks.0.ln1.weight" in split["not_decayed"] and "blocks.0.attn.qkv.bias" in split["not_decayed"]
    assert {"tok_emb.weight", "pos_emb.weight", "head.weight", "blocks.0.mlp.fc.weight"} <= set(split["decayed"]) or \
        params.train.weight_decay == 0.0
    clip = check(report, "clipping_contract")["measured"]
    assert clip["cutting"]["reported_norm"] > clip["cutting"]["grad_clip"], "the second case really clips"
    assert clip["cutting"]["norm_at_step"] == pytest.approx(clip["cutting"]["grad_clip"], rel=1e-3)
    schedule = check(report, "lr_schedule")["measured"]
    assert schedule["steps"] == params.train.max_steps
    assert ("max_seconds" in schedule) == ("train.max_seconds=30" in overrides)


def test_a_schedule_whose_tail_is_wrong_fails_lr_schedule_alone(project, monkeypatch):
    root, source = project
    params = recompose(root, source, [])
    monkeypatch.setattr(train_step, "cosine_with_warmup", lr_tail_at_zero)
    report = run_preflight(params, root)
    assert failed(report) == ["lr_schedule"], "the rehearsal's 60 steps never reach the tail: only this check sees it"
    message = check(report, "lr_schedule")["message"]
    assert f"by steps: below min_lr {0.1 * params.train.lr:g} at step {int(0.9 * params.train.max_steps)}" in message
    assert "ends at 0, not at min_lr" in message
    assert check(report, "lr_schedule")["measured"]["steps_evaluated"] == params.train.max_steps, "a failure: all"


def test_a_million_step_bound_is_evaluated_densely_where_it_bends_and_sampled_after():
    steps = step_checks.evaluated_steps(1_000_000, 100)
    assert steps[0] == 1 and steps[-1] == 1_000_000 and np.all(np.diff(steps) > 0)
    assert np.array_equal(steps[:step_checks.DENSE_STEPS], np.arange(1, step_checks.DENSE_STEPS + 1))
    assert {500_000, 999_999} <= set(steps.tolist())
    assert steps.size <= step_checks.DENSE_STEPS + step_checks.SAMPLED_STEPS + 3
    assert np.array_equal(step_checks.evaluated_steps(300, 20), np.arange(1, 301)), "a short run: every step"
    assert step_checks.evaluated_steps(50_000, 20_000)[:20_001].tolist() == list(range(1, 20_002)), "all of warmup"


def test_one_bad_step_far_past_warmup_fails_lr_schedule_naming_it(project, monkeypatch):
    root, source = project
    params = recompose(root, source, ["train.max_steps=200000"])
    steps = step_checks.evaluated_steps(params.train.max_steps, params.train.warmup_steps)
    bad = int(steps[np.searchsorted(steps, 150_000)])  # a step of the sample, far from the dense start
    real = train_step.cosine_with_warmup

    def bump(step, warmup, total, peak, floor=None, time_fraction=0.0):
        return real(step, warmup, total, peak, floor, time_fraction) * (1.5 if step == bad else 1.0)

    monkeypatch.setattr(train_step, "cosine_with_warmup", bump)
    report = run_preflight(params, root)
    assert failed(report) == ["lr_schedule"]
    message = check(report, "lr_schedule")["message"]
    assert f"rises after warmup at step {bad} (" in message and f"at 1 of {params.train.max_steps} steps" in message


def test_a_schedule_that_ignores_the_clock_fails_lr_schedule(project, monkeypatch):
    root, source = project
    params = recompose(root, source, ["train.max_seconds=30"])
    real = train_step.cosine_with_warmup
    monkeypatch.setattr(train_step, "cosine_with_warmup",
                        lambda step, warmup, total, peak, floor=None, time_fraction=0.0:
                            real(step, warmup, total, peak, floor))
    report = run_preflight(params, root)
    assert failed(report) == ["lr_schedule"]
    assert "on the clock at step" in check(report, "lr_schedule")["message"]


def test_layernorm_weights_in_the_decay_group_fail_decay_split(project, monkeypatch):
    root, source = project
    params = recompose(root, source, [])
    monkeypatch.setattr(optim, "build_param_groups", layernorm_weights_decayed)
    report = run_preflight(params, root)
    assert failed(report) == ["decay_split"]
    message = check(report, "decay_split")["message"]
    assert "biases / LayerNorm parameters decayed: blocks.0.ln1.weight, blocks.0.ln2.weight" in message


def test_a_parameter_left_out_of_the_optimizer_fails_decay_split(project, monkeypatch):
    root, source = project
    params = recompose(root, source, [])
    real = optim.build_param_groups
    monkeypatch.setattr(optim, "build_param_groups",
                        lambda model, wd: [{**g, "params": [p for p in g["params"] if p is not model.head.weight]}
                                           for g in real(model, wd)])
    report = run_preflight(params, root)
    assert "decay_split" in failed(report)
    assert "trainable but in no group (never updated): head.weight" in check(report, "decay_split")["message"]


def test_clipping_over_the_wrong_tensors_fails_clipping_contract(project, monkeypatch):
    root, source = project
    params = recompose(root, source, [])
    monkeypatch.setattr(train_step, "training_step", clip_over_the_last_layer_only)
    report = run_preflight(params, root)
    assert "clipping_contract" in failed(report)
    message = check(report, "clipping_contract")["message"]
    assert "is not the global gradient norm before clipping" in message
    assert "the optimizer stepped on a gradient of norm" in message
