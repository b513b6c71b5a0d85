"""`make machine`: the choices the presets leave to the machine (train.precision auto, a budget preset's shape) are
measured once, written to conf/machine/, composed into params.yaml, and refused when made for another machine or
another configuration; preflight then times nothing and the run trains exactly params.yaml."""

import json
import re
import shutil

import pytest

from helpers import REPO_ROOT
from helpers.machines import TINY_SMALL
from helpers.pipeline_fixture import recompose, run_stage
from minigpt.core.compose import compose_params
from minigpt.core.config import load_params
from minigpt.core.paths import DEBUG_REPORT
from minigpt.model import precision
from minigpt.preflight.suite import run_preflight
from minigpt.train import machine_command, precision_choice
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train
from minigpt.train.machine_choice import MachineChoiceError, current_label, verify_machine_choice
from minigpt.train.machine_command import measure_machine, reset_machine

# tokens/s a fake timing reports per shape: the rule then picks small at 72 s and at 15 minutes (an AVX2-only CPU)
SLOW_CPU = {"small": 3_500.0, "small-regularised": 2_900.0, "production": 1_100.0}
PARAMETERS = {"small": 876_032, "small-regularised": 876_032, "production": 3_357_696}


@pytest.fixture
def conf(tmp_path):
    """A private copy of conf/ with the shipped, unmeasured conf/machine/ files (whatever this checkout holds)."""
    copy = tmp_path / "conf"
    shutil.copytree(REPO_ROOT / "conf", copy)
    reset_machine(copy, say=lambda _m: None)
    return copy


def fake_timing(monkeypatch, rates: dict, calls: list):
    def measured(params, vocab_size, device):
        calls.append(params.shape)  # None: the default preset's precision
        return {"choice": "fp32", "tokens_per_s": rates.get(params.shape, 9_000.0),
                "parameters": PARAMETERS.get(params.shape, 3_000_000), "configured": "auto"}
    monkeypatch.setattr(machine_command, "measure_training", measured)


def composed(conf, tmp_path, overrides):
    out = tmp_path / "composed.yaml"
    compose_params(out, conf, overrides)
    return load_params(out)


def test_make_machine_writes_each_presets_choice_and_keeps_it_while_nothing_changes(conf, tmp_path, monkeypatch):
    calls = []
    fake_timing(monkeypatch, SLOW_CPU, calls)
    assert measure_machine(conf, say=lambda _m: None) == {"default": "measured", "budget-15m": "measured",
                                                          "budget-72s": "measured"}
    shapes_timed = sorted(c for c in calls if c is not None)
    # production is in both presets' lists, timed once per configuration: budget-72s's has the n-gram tables
    assert shapes_timed == ["production", "production", "small", "small-regularised"]
    params = composed(conf, tmp_path, ["experiment=budget-72s"])
    assert params.shape == "small" and params.machine.shape == "small" and params.model.embedding_dim == 128
    assert params.machine.label == current_label(params) and params.machine.tokens_per_s == 3_500.0
    assert verify_machine_choice(params) == params.machine
    assert composed(conf, tmp_path, ["experiment=budget-15m"]).shape == "small-regularised"

    calls.clear()
    assert set(measure_machine(conf, say=lambda _m: None).values()) == {"kept"} and calls == []

    # a changed shape: the stored choice no longer matches what the preset composes, until it is measured again
    small = conf / "shape" / "small.yaml"
    small.write_text(small.read_text().replace("num_layers: 4, dropout: 0.0", "num_layers: 3, dropout: 0.0"))
    changed = composed(conf, tmp_path, ["experiment=budget-72s"])
    with pytest.raises(MachineChoiceError, match=r"budget-72s.yaml: timed for another configuration"):
        verify_machine_choice(changed)
    assert measure_machine(conf, say=lambda _m: None) == {"default": "kept", "budget-15m": "measured",
                                                          "budget-72s": "measured"}
    assert verify_machine_choice(composed(conf, tmp_path, ["experiment=budget-72s"])).shape == "small"


def test_a_shape_two_presets_compose_alike_is_timed_once(conf, monkeypatch):
    calls = []
    fake_timing(monkeypatch, SLOW_CPU, calls)
    preset = conf / "experiment" / "budget-72s.yaml"
    text = preset.read_text()
    # without its n-gram tables and its batch, budget-72s composes the production shape as budget-15m does
    preset.write_text(re.sub(r"\n  batch_size: .*", "", text[:text.index("model:")] + text[text.index("train:"):]))
    measure_machine(conf, say=lambda _m: None)
    assert sorted(c for c in calls if c is not None) == ["production", "small", "small-regularised"]


def test_the_rule_picks_a_bigger_shape_where_the_machine_is_fast_enough(conf, tmp_path, monkeypatch):
    fake_timing(monkeypatch, {"small": 40_000.0, "small-regularised": 36_000.0, "production": 12_000.0}, [])
    measure_machine(conf, say=lambda _m: None)
    # 12,000 tokens/s x 900 s / 3.36M parameters = 3.2 tokens per parameter (>= 2); in 72 s, 0.26
    assert composed(conf, tmp_path, ["experiment=budget-15m"]).shape == "production"
    assert composed(conf, tmp_path, ["experiment=budget-72s"]).shape == "small"


def test_no_timing_where_the_machine_answers_and_the_default_preset_gets_its_precision(conf, tmp_path, monkeypatch):
    from helpers.machines import AVX2_ONLY

    calls = []
    fake_timing(monkeypatch, SLOW_CPU, calls)
    monkeypatch.setattr(precision, "cpu_info", lambda: AVX2_ONLY)
    measure_machine(conf, say=lambda _m: None)
    params = composed(conf, tmp_path, [])
    assert params.train.precision == "fp32" and params.machine.timed is None and params.machine.tokens_per_s is None
    assert "no bf16 instructions" in params.machine.how and None not in calls, "the default preset timed nothing"
    assert verify_machine_choice(params) == params.machine


def test_an_explicit_override_wins_over_every_preset_and_shape(conf, tmp_path, monkeypatch):
    fake_timing(monkeypatch, SLOW_CPU, [])
    measure_machine(conf, say=lambda _m: None)
    for preset in ("budget-72s", "budget-15m"):
        for forced in (None, "small", "small-regularised", "production"):
            params = composed(conf, tmp_path, [f"experiment={preset}", "train.lr=0.0015", "train.batch_size=8",
                                               *([f"shape={forced}"] if forced else [])])
            assert params.train.lr == 0.0015 and params.train.batch_size == 8, (preset, forced)
            assert params.shape == (forced or params.machine.shape), (preset, forced)


def test_a_choice_made_elsewhere_stops_the_run_with_one_line(conf, tmp_path, monkeypatch):
    fake_timing(monkeypatch, SLOW_CPU, [])
    unmeasured = composed(conf, tmp_path, ["experiment=budget-72s"])
    with pytest.raises(MachineChoiceError) as refused:
        verify_machine_choice(unmeasured)
    message = str(refused.value)
    assert message.startswith("conf/machine/budget-72s.yaml: no choice has been measured on this machine yet; run "
                              "`make machine`") and "\n" not in message
    measure_machine(conf, say=lambda _m: None)
    params = composed(conf, tmp_path, ["experiment=budget-72s"])
    elsewhere = params.model_copy(update={"machine": params.machine.model_copy(update={"label": "another CPU"})})
    with pytest.raises(MachineChoiceError, match=r"measured on another machine \(another CPU; this one is .*\); run "
                                                 r"`make machine`"):
        verify_machine_choice(elsewhere)
    with pytest.raises(MachineChoiceError, match="timed for another configuration"):
        verify_machine_choice(composed(conf, tmp_path, ["experiment=budget-72s", "model.num_layers=6"]))
    # every value it chose replaced by hand: nothing of it is used, nothing is checked
    forced = composed(conf, tmp_path, ["experiment=budget-72s", "machine=none", "shape=production",
                                       "train.precision=fp32"])
    assert forced.machine is None and verify_machine_choice(forced) is None
    elsewhere_forced = composed(conf, tmp_path, ["experiment=budget-72s", "shape=production"])
    elsewhere_forced = elsewhere_forced.model_copy(update={"machine": elsewhere.machine})
    assert verify_machine_choice(elsewhere_forced) is None, "a forced shape does not use the budget choice"
    with pytest.raises(MachineChoiceError, match=r"'train.precision' is auto but no choice measured on this machine"):
        verify_machine_choice(composed(conf, tmp_path, ["machine=none"]))


TINY_RUN = ["experiment=budget-72s", "train.max_steps=20", "train.eval_every=10", "train.sample_length=0",
            "preflight.overfit_steps=30", "preflight.overfit_threshold=5.0"]


def test_with_a_stored_choice_preflight_times_nothing_and_train_trains_params_yaml(project, conf, monkeypatch):
    root, source = project
    (conf / "shape" / "small.yaml").write_text(TINY_SMALL)
    fake_timing(monkeypatch, SLOW_CPU, [])
    measure_machine(conf, say=lambda _m: None)
    timings = []
    monkeypatch.setattr(precision, "interleaved_seconds", lambda *a, **k: timings.append(a) or {})
    monkeypatch.setattr(precision_choice, "measure_training", lambda *a, **k: timings.append(a) or {})
    params = recompose(root, source, [*TINY_RUN, "train.lr=0.02"], conf)
    run_stage(root, "soft_targets")  # the preset's soft targets (soft_targets.order 9)
    report = run_preflight(params, root)
    assert report["passed"], report["failed"]
    assert timings == [], "preflight proves the run; it does not time it"
    assert report["machine"]["shape"] == "small" and report["config"]["shape"] == "small"
    lines = []
    summary = train(params, root, out=lines.append)
    assert summary["shape"] == "small" and summary["model"] == params.section_dict("model")
    assert summary["precision"] == params.train.precision == "fp32"
    assert summary["watchdogs"]["reference_tokens_per_s"] == 3_500.0, "the throughput reference is the stored timing"
    assert any(line.startswith("[train] conf/machine/budget-72s.yaml: precision fp32, shape small (") for line in lines)
    log = [json.loads(line) for line in (root / "reports" / "train_log.jsonl").read_text().splitlines()]
    peak = max(r["lr"] for r in log if "lr" in r)
    assert peak == pytest.approx(0.02, rel=0.05), "the explicit LR (not the shape's 0.01) is the applied peak"

    # the gate binds the shape and the choice: another shape, forced, is another run
    other = recompose(root, source, [*TINY_RUN, "train.lr=0.02", "shape=production", "train.warmup_steps=5"], conf)
    with pytest.raises(GateError, match=r"mismatched fingerprint: config \(.*shape"):
        verify_gate(other, root)
    # a report carried to another machine: the gate refuses the choice before anything else
    elsewhere = params.model_copy(update={"machine": params.machine.model_copy(update={"label": "another CPU"})})
    with pytest.raises(MachineChoiceError, match="measured on another machine"):
        verify_gate(elsewhere, root)
    with pytest.raises(MachineChoiceError, match="measured on another machine"):
        run_preflight(elsewhere, root)
    assert not (root / DEBUG_REPORT).exists(), "a refused preflight leaves no report standing"
