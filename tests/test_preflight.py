"""The preflight checks: the correct pipeline passes; each deliberate break fails its own check, by name."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import REPO_ROOT
from helpers.pipeline_fixture import load_stage, recompose
from minigpt.core.config import load_params
from minigpt.core.io_utils import sha256_file
from minigpt.data import batching
from minigpt.data.encode import encode_splits
from minigpt.data.tokenizer import CharTokenizer
from minigpt.model import devices as device_module
from minigpt.model import gpt as model_module
from minigpt.model.gpt import MiniGPT
from minigpt.preflight import suite
from minigpt.preflight.checks import describe_time, format_table
from minigpt.preflight.suite import CHECKS, run_preflight
from minigpt.testing.planted_bugs import (
    lr_zero_after_warmup,
    zero_grad_between_backward_and_step,
)
from minigpt.train import gate, train_step
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train
from minigpt.train.watchdogs import WatchdogStop


def statuses(report):
    return {c["name"]: c["status"] for c in report["checks"]}


def failed(report):
    return [c["name"] for c in report["checks"] if c["status"] == "failed"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_correct_pipeline_passes_every_check(project, seed):
    root, source = project
    params = recompose(root, source, [f"preflight.seed={seed}"])
    report = run_preflight(params, root)
    assert report["passed"], format_table(report["checks"])
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
    seconds = report["seconds"]
    assert seconds["total"] == pytest.approx(sum(c["seconds"] for c in report["checks"]), abs=0.01)
    assert seconds["preflight"] >= seconds["total"] - 0.01 and "timings" not in seconds
    assert report["machine"] is None, "the debug preset composes no machine choice"


def test_the_preflight_time_line_names_each_part_and_the_share_of_the_budget():
    seconds = {"total": 9.8, "without_overfit": 8.1, "preflight": 10.8}
    line = describe_time(seconds, 72)
    assert line == ("checks 9.80 s (8.10 s without the overfit check); preflight 10.80 s = 15.0% of "
                    "train.max_seconds (72 s)")
    assert describe_time(seconds).endswith("preflight 10.80 s")
    assert describe_time({"total": 3.0, "without_overfit": 2.0}) == (
        "checks 3.00 s (2.00 s without the overfit check); preflight ?")


def test_every_check_has_a_family_and_a_readable_evidence_formatter():
    from minigpt.report.evidence import FORMATTERS

    assert {c.name: c.family for c in CHECKS if c.family not in ("correctness", "numerical", "optimisation")} == {}
    assert set(FORMATTERS) == {c.name for c in CHECKS}


def test_the_overfit_check_stops_once_the_batch_is_memorised(project):
    root, source = project
    report = run_preflight(recompose(root, source, []), root)
    overfit = next(c for c in report["checks"] if c["name"] == "single_batch_overfit")["measured"]
    plain = overfit["dropout_0.0"]
    assert plain["steps_to_threshold"] is not None
    assert plain["final_loss"] < 0.1 and plain["steps_run"] < overfit["steps"], "it stops once the batch is memorised"


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
    tok = CharTokenizer.load(root / "data/tokenizer/tokenizer.json")
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
    report = run_preflight(recompose(root, source, ["train.lr=1.0"]), root)
    assert failed(report) == ["lr_stability"]
    assert statuses(report)["rehearsal_learns"] == "skipped"
    message = next(c for c in report["checks"] if c["name"] == "lr_stability")["message"]
    assert "learning rate is too high" in message


def test_lr_stability_rehearses_the_runs_warmup_then_the_peak(project):
    """The rehearsal applies the run's schedule: linear warmup (shortened to rehearsal_warmup_max), then the peak."""
    root, source = project

    def applied(overrides):
        report = run_preflight(recompose(root, source, overrides), root)
        return next(c for c in report["checks"] if c["name"] == "lr_stability")["measured"]

    short = applied(["train.lr=2e-3", "train.warmup_steps=10", "train.max_steps=100000"])
    lrs = short["lrs"]
    assert short["warmup_steps"] == 10 and len(lrs) == 10 + 40
    assert lrs[:10] == pytest.approx([2e-3 * k / 10 for k in range(1, 11)])
    assert lrs[10:] == pytest.approx([2e-3] * 40, rel=1e-4), "near the peak after warmup (cosine over 100k steps)"
    capped = applied(["train.lr=2e-3", "train.warmup_steps=500", "train.max_steps=100000"])
    assert capped["warmup_steps"] == 20 and capped["lrs"][0] == pytest.approx(2e-3 / 20)
    assert capped["max_lr_applied"] == pytest.approx(2e-3)


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


def partly_frozen_model(config):
    model = MiniGPT(config)
    model.blocks[0].mlp.fc.weight.requires_grad_(False)
    return model


def test_a_partly_frozen_model_fails_by_the_parameters_name(project):
    """The configuration trains every parameter: one frozen layer is a bug that a loss curve would hide."""
    root, source = project
    report = run_preflight(recompose(root, source, []), root, model_factory=partly_frozen_model)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["gradients"]["status"] == "failed"
    assert "frozen parameters (requires_grad=False) that the run would never train: blocks.0.mlp.fc.weight" in \
        checks["gradients"]["message"]
    assert checks["optimizer_update"]["status"] == "failed"
    assert checks["optimizer_update"]["measured"]["unchanged"] == ["blocks.0.mlp.fc.weight"]
    assert report["frozen_parameters"] == ["blocks.0.mlp.fc.weight"]


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
    path = root / "data/tokenizer/tokenizer.json"
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
    recompose(root, source, ["train.lr=1.0"])
    result = subprocess.run([sys.executable, str(REPO_ROOT / "stages/preflight.py")], cwd=root, capture_output=True,
                            text=True)
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
    assert verify_gate(params, root).report["passed"] is True


def test_gate_refuses_missing_failed_edited_and_stale_reports(project):
    root, source = project
    params = recompose(root, source, [])
    report_path = root / "reports/debug_report.json"
    with pytest.raises(GateError, match="no debug report"):
        verify_gate(params, root)

    run_preflight(recompose(root, source, ["train.lr=1.0"]), root)
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

    tok = CharTokenizer.load(root / "data/tokenizer/tokenizer.json")
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
    bound = set(gate.GATED_SECTIONS) | {f"train.{k}" for k in gate.GATED_TRAIN_KEYS}
    assert declared == bound


# ------------------------------------------------------------------ bugs planted in the training code itself

def test_a_step_order_bug_in_the_training_step_fails_optimizer_update_and_really_breaks_training(project):
    root, source = project
    params = recompose(root, source, ["train.max_steps=60", "train.eval_every=60", "train.eval_batches=2",
                                      "train.sample_length=0"])
    original = train_step.training_step
    try:
        train_step.training_step = zero_grad_between_backward_and_step
        report = run_preflight(params, root)
        # the same planted bug in the loop that train() runs: the gradient_flow watchdog stops it at step 3
        with pytest.raises(WatchdogStop, match=r"watchdog gradient_flow stopped the run at step 3: no gradient for"):
            train(params, root, require_gate=False, out=lambda _m: None)
        # and, with the watchdog made blind to it, the run learns nothing
        broken = train(recompose(root, source, ["train.max_steps=60", "train.eval_every=60", "train.eval_batches=2",
                                                "train.sample_length=0", "watch.dead_grad_steps=1000"]),
                       root, require_gate=False, out=lambda _m: None)
    finally:
        train_step.training_step = original
    # the step measures its norm after zero_grad too: clipping_contract sees a norm of 0 against the real one
    assert failed(report) == ["optimizer_update", "clipping_contract"]
    assert "one training step changed no parameter" in next(
        c for c in report["checks"] if c["name"] == "optimizer_update")["message"]
    assert statuses(report)["lr_stability"] == statuses(report)["rehearsal_learns"] == "skipped"
    (root / "models/mini_gpt_latest.pt").unlink()
    healthy = train(params, root, require_gate=False, out=lambda _m: None)
    log_v = np.log(report["vocab_size"])
    assert broken["best_val_loss"] > log_v - 0.25 and healthy["best_val_loss"] < log_v - 1.0


def test_a_learning_rate_far_too_low_fails_rehearsal_learns(project):
    root, source = project
    report = run_preflight(recompose(root, source, ["train.lr=1e-6"]), root)
    assert failed(report) == ["rehearsal_learns"]
    check = next(c for c in report["checks"] if c["name"] == "rehearsal_learns")
    assert "the training step does not learn" in check["message"]
    assert check["measured"]["probe_loss_after"] > check["measured"]["bar"]


def test_a_schedule_that_drops_the_lr_to_zero_fails_lr_stability(project, monkeypatch):
    root, source = project
    monkeypatch.setattr(train_step, "cosine_with_warmup", lr_zero_after_warmup)
    report = run_preflight(recompose(root, source, []), root)
    assert failed(report) == ["lr_schedule", "lr_stability"], "the whole schedule, and the rehearsal that applies it"
    assert "the LR schedule is broken" in next(c for c in report["checks"] if c["name"] == "lr_stability")["message"]


def test_a_schedule_that_sends_the_lr_far_above_the_peak_fails_lr_stability(project, monkeypatch):
    real = train_step.cosine_with_warmup
    monkeypatch.setattr(train_step, "cosine_with_warmup", lambda *a, **k: 100 * real(*a, **k))
    root, source = project
    report = run_preflight(recompose(root, source, []), root)
    assert "lr_stability" in failed(report)
    assert "outside (0, 0.003]" in next(c for c in report["checks"] if c["name"] == "lr_stability")["message"]


def test_an_autocast_path_that_cuts_the_graph_fails_gradients_in_bf16(project, monkeypatch):
    """The bf16 path (the production precision) reusing inference's context: fp32 preflight would never see it."""
    real = device_module.autocast_for

    def inference_autocast(device, precision):
        if precision == "bf16":
            return torch.inference_mode()
        return real(device, precision)

    root, source = project
    monkeypatch.setattr(device_module, "autocast_for", inference_autocast)
    fp32 = run_preflight(recompose(root, source, ["train.precision=fp32"]), root)
    assert fp32["passed"], format_table(fp32["checks"])
    bf16 = run_preflight(recompose(root, source, ["train.precision=bf16"]), root)
    assert failed(bf16)[0] == "gradients"
    message = next(c for c in bf16["checks"] if c["name"] == "gradients")["message"]
    assert message.startswith("the check raised RuntimeError") and "raised in" in message


def test_bf16_preflight_rehearses_in_bf16_and_passes(project):
    root, source = project
    report = run_preflight(recompose(root, source, ["train.precision=bf16"]), root)
    assert report["passed"], format_table(report["checks"])
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["lr_stability"]["measured"]["precision"] == "bf16"
    assert checks["single_batch_overfit"]["measured"]["precision"] == "bf16"


# ------------------------------------------------------------- crashes become failures, never a stale report

def detached_forward(self, inputs, targets=None):
    """MiniGPT.forward with the residual stream cut from the embeddings."""
    positions = torch.arange(inputs.shape[1], device=inputs.device)
    x = (self.tok_emb(inputs) + self.pos_emb(positions)).detach()
    for block in self.blocks:
        x = block(x)
    logits = self.head(self.ln_f(x))
    loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
    return logits, loss


def test_a_detached_residual_stream_fails_by_name_with_a_report_and_no_traceback(project, monkeypatch, capsys):
    root, source = project
    recompose(root, source, [])
    monkeypatch.chdir(root)
    stage = load_stage("preflight")
    assert stage.stage_main("preflight", stage.run, []) == 0
    assert json.loads((root / "reports/debug_report.json").read_text())["passed"] is True
    capsys.readouterr()

    monkeypatch.setattr(MiniGPT, "forward", detached_forward)
    assert stage.stage_main("preflight", stage.run, []) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    report = json.loads((root / "reports/debug_report.json").read_text())
    assert report["passed"] is False and "causal_independence" in report["failed"]
    causal = next(c for c in report["checks"] if c["name"] == "causal_independence")
    assert "the residual stream is cut from the embeddings" in causal["message"] and "'tok_emb'" in causal["message"]
    assert "no gradient for tok_emb.weight, pos_emb.weight" in next(
        c for c in report["checks"] if c["name"] == "gradients")["message"]
    assert "causal_independence" in err


def test_any_exception_in_a_check_is_that_checks_failure(project, monkeypatch):
    root, source = project

    def broken_batches(data, batch_size, block_size, device="cpu", generator=None):
        raise ValueError("planted")

    monkeypatch.setattr(batching, "get_batch", broken_batches)
    report = run_preflight(recompose(root, source, []), root)
    assert failed(report) == ["batch_shift"]
    message = next(c for c in report["checks"] if c["name"] == "batch_shift")["message"]
    assert message.startswith("the check raised ValueError: planted (raised in test_preflight.py:")
    assert statuses(report)["forward_shapes"] == "skipped"
    assert json.loads((root / "reports/debug_report.json").read_text())["passed"] is False


def test_a_crash_outside_the_checks_leaves_no_report_behind(project, monkeypatch):
    root, source = project
    params = recompose(root, source, [])
    assert run_preflight(params, root)["passed"]

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(suite, "run_checks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_preflight(params, root)
    assert not (root / "reports/debug_report.json").exists()
    with pytest.raises(GateError, match="no debug report"):
        verify_gate(params, root)


# ---------------------------------------------------------------------------------------- data over whole splits

def test_the_tokenizer_check_covers_every_character_of_every_split(project):
    root, source = project
    params = recompose(root, source, [])
    clean = root / "data/clean/val.txt"
    text = clean.read_text()
    position = len(text) - 10  # far past any prefix
    chars = CharTokenizer.load(root / "data/tokenizer/tokenizer.json").chars
    replacement = next(c for c in chars if c != text[position])
    clean.write_text(text[:position] + replacement + text[position + 1:])
    report = run_preflight(params, root)
    assert failed(report) == ["tokenizer"]
    message = next(c for c in report["checks"] if c["name"] == "tokenizer")["message"]
    assert f"decoded val IDs differ from data/clean/val.txt at character {position}" in message


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_a_split_shorter_than_one_window_fails_token_ids_by_name(project, split):
    root, source = project
    params = recompose(root, source, [])
    tok = CharTokenizer.load(root / "data/tokenizer/tokenizer.json")
    texts = {s: (root / f"data/clean/{s}.txt").read_text() for s in ("train", "val", "test")}
    texts[split] = texts[split][: params.model.block_size]  # one token short of a window
    for name, text in texts.items():
        (root / f"data/clean/{name}.txt").write_text(text)
    encode_splits(texts, tok, root / "data/encoded")
    report = run_preflight(params, root)
    assert failed(report) == ["token_ids"]
    message = next(c for c in report["checks"] if c["name"] == "token_ids")["message"]
    assert f"{split}: {params.model.block_size} tokens, fewer than one window of model.block_size + 1" in message


# ----------------------------------------------------------------------------------------------- false alarms

@pytest.mark.slow
def test_no_false_alarm_over_30_seeds_and_the_divergent_lrs_still_fail(project):
    root, source = project
    alarms = []
    for seed in range(1, 31):
        report = run_preflight(recompose(root, source, [f"preflight.seed={seed}"]), root)
        if not report["passed"]:
            alarms.append((seed, failed(report)))
    assert alarms == []
    for lr in ("1.0", "10.0"):
        report = run_preflight(recompose(root, source, [f"train.lr={lr}"]), root)
        assert "lr_stability" in failed(report), lr
    # 0.1 collapses to character frequencies rather than blowing up (benchmarks/preflight_false_alarms.py)
    assert "rehearsal_learns" in failed(run_preflight(recompose(root, source, ["train.lr=0.1"]), root))
