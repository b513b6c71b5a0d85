"""train.ema_decay: the run evaluates, keeps and samples a moving average of its weights; the average follows its
specification, the checkpoints hold both sets of weights, a run resumes bit for bit, and weight_average catches a
planted average."""

import json
import math
import os
import shutil
import signal

import pytest
import torch

from helpers.pipeline_fixture import recompose
from helpers.tiny_models import small_config
from minigpt.core.paths import BEST_CHECKPOINT, LATEST_CHECKPOINT, TOKENIZER_FILE, TRAIN_LOG
from minigpt.model.checkpoint import load_checkpoint, load_trained_model
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.checks import format_table
from minigpt.preflight.suite import run_preflight
from minigpt.report.evidence import evidence
from minigpt.testing.planted_bugs import average_weighted_the_wrong_way, average_without_a_copy
from minigpt.train.loop import train
from minigpt.train.run_control import TrainingStopped
from minigpt.train.weight_average import WeightAverage, decay_at

FAST = ["train.max_steps=40", "train.eval_every=10", "train.eval_batches=2", "train.sample_length=10",
        "model.dropout=0.1"]


def check(report, name):
    return next(c for c in report["checks"] if c["name"] == name)


def failed(report):
    return [c["name"] for c in report["checks"] if c["status"] == "failed"]


def test_the_average_follows_its_formula_and_leaves_the_trained_weights_alone():
    torch.manual_seed(0)
    trained = MiniGPT(small_config())
    average = WeightAverage(trained, 0.9)
    expected = {n: p.detach().double().clone() for n, p in trained.named_parameters()}
    for n in range(1, 31):
        with torch.no_grad():
            for p in trained.parameters():
                p.add_(torch.randn_like(p))
        before = {n: p.detach().clone() for n, p in trained.named_parameters()}
        average.update(trained)
        kept = min(0.9, n / (n + 9))
        expected = {k: kept * v + (1 - kept) * before[k].double() for k, v in expected.items()}
        assert all(torch.equal(p, before[k]) for k, p in trained.named_parameters())
    got = dict(average.model.named_parameters())
    assert max(float((got[k].double() - v).abs().max()) for k, v in expected.items()) < 1e-5
    assert decay_at(0.9, 1) == pytest.approx(0.1) and decay_at(0.9, 100) == 0.9
    assert not average.model.training and not any(p.requires_grad for p in average.model.parameters())


def test_a_run_with_the_average_passes_preflight_trains_and_keeps_the_average(project):
    root, source = project
    params = recompose(root, source, [*FAST, "train.ema_decay=0.9"])
    report = run_preflight(params, root)
    assert report["passed"], format_table(report["checks"])
    measured = check(report, "weight_average")["measured"]
    assert measured["ema_decay"] == 0.9 and measured["max_abs_difference"] < 1e-5
    lines = dict(evidence(check(report, "weight_average")))
    assert lines["moving average"].startswith("decay 0.9") and "12 updates" in lines["against its formula"]
    summary = train(params, root, out=lambda _m: None)
    assert summary["ema_decay"] == 0.9 and summary["best_val_loss"] < math.log(report["vocab_size"]) - 0.3
    evals = [r for r in map(json.loads, (root / TRAIN_LOG).read_text().splitlines())
             if "val_loss" in r]
    assert len(evals) == 4 and all("val_loss_trained" in r for r in evals)
    assert any(r["val_loss"] != r["val_loss_trained"] for r in evals), "the average is not the trained weights"
    best = load_checkpoint(root / BEST_CHECKPOINT)
    assert set(best["trained_state_dict"]) == set(best["model_state_dict"])
    differs = [k for k in best["model_state_dict"]
               if not torch.equal(best["model_state_dict"][k], best["trained_state_dict"][k])]
    assert "tok_emb.weight" in differs
    # what evaluate and generate load is the average
    model = load_trained_model(root / BEST_CHECKPOINT, root / TOKENIZER_FILE).model
    assert torch.equal(model.state_dict()["tok_emb.weight"], best["model_state_dict"]["tok_emb.weight"])


def test_without_the_option_there_is_nothing_to_check_and_no_second_set_of_weights(project):
    root, source = project
    params = recompose(root, source, FAST)
    report = run_preflight(params, root)
    assert check(report, "weight_average")["status"] == "passed"
    assert check(report, "weight_average")["measured"]["ema_decay"] is None
    train(params, root, out=lambda _m: None)
    assert "trained_state_dict" not in load_checkpoint(root / LATEST_CHECKPOINT)


def test_a_stopped_run_with_the_average_resumes_to_the_uninterrupted_weights(project, tmp_path):
    root, source = project
    params = recompose(root, source, [*FAST, "train.ema_decay=0.95"])
    twin = shutil.copytree(root, tmp_path / "twin")

    def stop_at_20(message):
        if message.startswith("[train] step 20: val loss"):
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(TrainingStopped):
        train(params, root, require_gate=False, out=stop_at_20)
    assert load_checkpoint(root / LATEST_CHECKPOINT)["average_updates"] == 20
    train(params, root, require_gate=False, out=lambda _m: None)
    train(params, twin, require_gate=False, out=lambda _m: None)
    for key in ("model_state_dict", "trained_state_dict"):
        resumed, straight = (load_checkpoint(p / LATEST_CHECKPOINT)[key] for p in (root, twin))
        assert all(torch.equal(resumed[k], straight[k]) for k in straight), key


@pytest.mark.parametrize("plant,attribute,says", [
    (average_without_a_copy, "__init__", "shares storage with the trained weights"),
    (average_weighted_the_wrong_way, "update", "from its specification"),
])
def test_a_planted_average_fails_weight_average_by_name(project, monkeypatch, plant, attribute, says):
    root, source = project
    params = recompose(root, source, [*FAST, "train.ema_decay=0.9"])
    monkeypatch.setattr(WeightAverage, attribute, plant)
    report = run_preflight(params, root)
    assert failed(report) == ["weight_average"]
    assert says in check(report, "weight_average")["message"]
