"""The preflight checks: the correct pipeline passes; each deliberate break fails its own check, by name."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from minigpt import batching, diagnostics
from minigpt import model as model_module
from minigpt.config import load_params
from minigpt.diagnostics import CHECKS, GateError, run_preflight, verify_gate
from minigpt.encoding import encode_splits
from minigpt.io_utils import sha256_file
from minigpt.model import MiniGPT
from minigpt.tokenizer import CharTokenizer

from pipeline_fixture import REPO_ROOT, recompose


def statuses(report):
    return {c["name"]: c["status"] for c in report["checks"]}


def failed(report):
    return [c["name"] for c in report["checks"] if c["status"] == "failed"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_pipeline_passes_every_check(project, seed):
    root, source = project
    params = recompose(root, source, [f"preflight.seed={seed}"])
    report = run_preflight(params, root)
    assert report["passed"], diagnostics.format_table(report["checks"])
    assert [c["name"] for c in report["checks"]] == [c.name for c in CHECKS]
    assert set(statuses(report).values()) == {"passed"}
    vocab = report["vocab_size"]
    assert report["expected_initial_loss"] == pytest.approx(np.log(vocab))
    assert abs(report["initial_loss"] - np.log(vocab)) < 0.1
    assert report["batch_shape"] == [params.preflight.batch_size, params.model.block_size]
    assert report["missing_gradients"] == [] and report["grad_norm"] > 0 and report["param_update_max"] > 0
    assert report["single_batch_final_loss"] < params.preflight.overfit_threshold
    written = json.loads((root / "reports" / "debug_report.json").read_text())
    assert written == report


def test_report_compares_dropout_in_the_overfit_check(project):
    root, source = project
    report = run_preflight(recompose(root, source, []), root)
    overfit = next(c for c in report["checks"] if c["name"] == "single_batch_overfit")["measured"]
    plain, dropped = overfit["dropout_0.0"], overfit["dropout_0.2"]
    assert plain["steps_to_threshold"] is not None
    # dropout makes memorising one batch slower
    assert dropped["steps_to_threshold"] is None or dropped["steps_to_threshold"] > plain["steps_to_threshold"]


def test_unshifted_targets_fail_batch_shift(project, monkeypatch):
    root, source = project
    real = batching.get_batch

    def no_shift(data, batch_size, block_size, device="cpu", generator=None):
        inputs, _ = real(data, batch_size, block_size, device, generator)
        return inputs, inputs.clone()

    monkeypatch.setattr(batching, "get_batch", no_shift)
    report = run_preflight(recompose(root, source, []), root)
    assert failed(report) == ["batch_shift"]
    check = next(c for c in report["checks"] if c["name"] == "batch_shift")
    assert "targets are not the inputs shifted by one" in check["message"]
    assert "targets not shifted" in " ".join(check["likely_causes"])
    assert statuses(report)["forward_shapes"] == "skipped"
    assert "needs batch_shift failed" in next(c for c in report["checks"] if c["name"] == "forward_shapes")["message"]


def test_token_id_equal_to_vocab_size_fails_token_ids(project):
    root, source = project
    params = recompose(root, source, [])
    tok = CharTokenizer.load(root / "data/tokenizer/char_tokenizer.json")
    ids = np.load(root / "data/encoded/train.npy")
    ids[100] = tok.vocab_size  # a buggy encoder: off by one
    np.save(root / "data/encoded/train.npy", ids)
    meta_path = root / "data/encoded/meta.json"
    meta = json.loads(meta_path.read_text())
    meta["splits"]["train"]["sha256"] = sha256_file(root / "data/encoded/train.npy")
    meta_path.write_text(json.dumps(meta))
    report = run_preflight(params, root)
    assert "token_ids" in failed(report)
    message = next(c for c in report["checks"] if c["name"] == "token_ids")["message"]
    assert f"train: IDs span [0, {tok.vocab_size}] but must lie in [0, {tok.vocab_size - 1}]" in message


def non_causal(q, k, v, dropout_p):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=False)


def test_causal_mask_switched_off_fails_causal_independence(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(model_module, "causal_attention", non_causal)
    report = run_preflight(recompose(root, source, []), root)
    assert "causal_independence" in failed(report)
    measured = next(c for c in report["checks"] if c["name"] == "causal_independence")["measured"]
    assert measured["future_grad_max"] > 1e-6
    assert statuses(report)["single_batch_overfit"] == "skipped"


def test_learning_rate_too_high_fails_lr_stability(project):
    root, source = project
    report = run_preflight(recompose(root, source, ["train.lr=0.1"]), root)
    assert failed(report) == ["lr_stability"]
    message = next(c for c in report["checks"] if c["name"] == "lr_stability")["message"]
    assert "learning rate is too high" in message


def test_lr_stability_runs_the_configured_warmup_before_the_peak_lr(project):
    """A fresh model's first full-size AdamW steps spike the loss once; the run warms up, so the check does too."""
    root, source = project
    # the budget-72s model at lr 1.5e-3: without warmup its 5th step spikes (4.23 -> 5.02) and training recovers
    shape = ["model.embedding_dim=128", "model.num_heads=4", "model.num_layers=4", "model.block_size=64",
             "model.dropout=0.0", "train.betas=[0.9,0.99]", "train.lr=1.5e-3"]

    def lr_check(warmup):
        report = run_preflight(recompose(root, source, [*shape, f"train.warmup_steps={warmup}"]), root)
        return next(c for c in report["checks"] if c["name"] == "lr_stability")

    cold = lr_check(0)
    assert cold["status"] == "failed" and "spiked" in cold["message"]
    warm = lr_check(10)
    assert warm["status"] == "passed" and warm["measured"]["warmup_steps"] == 10
    assert len(warm["measured"]["losses"]) == 10 + 20 and warm["measured"]["losses"][0] == cold["measured"]["losses"][0]


def frozen_model(config):
    model = MiniGPT(config)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_frozen_parameters_fail_gradients_and_optimizer_update(project):
    root, source = project
    report = run_preflight(recompose(root, source, []), root, model_factory=frozen_model)
    assert {"gradients", "optimizer_update"} <= set(failed(report))
    assert "every parameter is frozen" in next(c for c in report["checks"] if c["name"] == "gradients")["message"]


class WithUnusedLayer(MiniGPT):
    def __init__(self, config):
        super().__init__(config)
        self.unused = nn.Linear(config.embedding_dim, config.embedding_dim)


def test_layer_unused_in_forward_fails_gradients(project):
    root, source = project
    report = run_preflight(recompose(root, source, []), root, model_factory=WithUnusedLayer)
    assert "gradients" in failed(report)
    check = next(c for c in report["checks"] if c["name"] == "gradients")
    assert check["measured"]["missing"] == ["unused.weight", "unused.bias"]
    assert report["missing_gradients"] == ["unused.weight", "unused.bias"]


class NanInSecondBlock(MiniGPT):
    def __init__(self, config):
        super().__init__(config)
        with torch.no_grad():
            self.blocks[1].attn.proj.weight[0, 0] = float("nan")


def test_nonfinite_output_is_located_by_module_path(project):
    root, source = project
    report = run_preflight(recompose(root, source, []), root, model_factory=NanInSecondBlock)
    assert failed(report)[0] == "forward_shapes"
    assert "first non-finite output in module 'blocks.1.attn.proj'" in next(
        c for c in report["checks"] if c["name"] == "forward_shapes")["message"]


def test_hooks_are_removed_after_the_checks(project):
    root, source = project
    built = []

    def factory(config):
        built.append(MiniGPT(config))
        return built[-1]

    run_preflight(recompose(root, source, []), root, model_factory=factory)
    assert built and all(not m._forward_hooks for model in built for m in model.modules())


def test_swapped_tokenizer_with_same_size_fails_tokenizer_and_gate(project):
    root, source = project
    params = recompose(root, source, [])
    assert run_preflight(params, root)["passed"]
    path = root / "data/tokenizer/char_tokenizer.json"
    tok = CharTokenizer.load(path)
    swapped = CharTokenizer(list(reversed(tok.chars)), tok.placeholder)
    swapped.save(path)
    with pytest.raises(GateError, match="mismatched fingerprint: tokenizer"):
        verify_gate(params, root)
    report = run_preflight(params, root)
    assert "tokenizer" in failed(report)
    message = next(c for c in report["checks"] if c["name"] == "tokenizer")["message"]
    assert "decoded train IDs differ from data/clean/train.txt at character 0" in message
    assert "encoded with a different tokenizer" in message


def test_preflight_stage_exits_nonzero_after_writing_the_report(project):
    root, source = project
    recompose(root, source, ["train.lr=0.1"])
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/preflight.py")], cwd=root, capture_output=True, text=True)
    assert result.returncode == 1
    assert "lr_stability           FAILED" in result.stdout
    assert "likely cause: learning rate too high" in result.stdout
    assert "check(s) failed: lr_stability" in result.stderr
    report = json.loads((root / "reports/debug_report.json").read_text())
    assert report["passed"] is False and report["failed"] == ["lr_stability"]


# ---------------------------------------------------------------------------------------------------- the gate

def test_gate_accepts_a_passing_current_report(project):
    root, source = project
    params = recompose(root, source, [])
    run_preflight(params, root)
    assert verify_gate(params, root)["passed"] is True


def test_gate_refuses_missing_failed_edited_and_stale_reports(project):
    root, source = project
    params = recompose(root, source, [])
    report_path = root / "reports/debug_report.json"
    with pytest.raises(GateError, match="no debug report"):
        verify_gate(params, root)

    run_preflight(recompose(root, source, ["train.lr=0.1"]), root)
    with pytest.raises(GateError, match=r"preflight failed \(lr_stability\)"):
        verify_gate(load_params(root / "params.yaml"), root)

    report = json.loads(report_path.read_text())
    report["passed"], report["failed"] = True, []
    report_path.write_text(json.dumps(report))
    with pytest.raises(GateError, match="edited by hand"):
        verify_gate(load_params(root / "params.yaml"), root)

    run_preflight(params, root)
    changed = recompose(root, source, ["train.lr=0.002"])
    with pytest.raises(GateError, match=r"config \(train.lr\)"):
        verify_gate(changed, root)
    recompose(root, source, [])

    tok = CharTokenizer.load(root / "data/tokenizer/char_tokenizer.json")
    texts = {s: (root / f"data/clean/{s}.txt").read_text() for s in ("train", "val", "test")}
    texts["val"] = texts["val"][: len(texts["val"]) // 2]
    encode_splits(texts, tok, root / "data/encoded")
    with pytest.raises(GateError, match="mismatched fingerprint: encoded val"):
        verify_gate(params, root)
    assert "dvc repro preflight" in str(pytest.raises(GateError, verify_gate, params, root).value)


def test_dvc_preflight_stage_reruns_on_exactly_the_params_the_gate_binds():
    """If preflight's dvc.yaml params and the gate's config fingerprint drift apart, a sweep could reuse a report
    made for other settings (DVC skips preflight) that the gate then refuses, or the reverse."""
    import yaml

    stage = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]["preflight"]
    declared = set(stage["params"])
    bound = {"model", "preflight"} | {f"train.{k}" for k in diagnostics.GATED_TRAIN_KEYS}
    assert declared == bound
