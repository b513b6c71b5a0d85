"""The training loop's watchdogs: each planted bug fires its own watchdog by name; a healthy run raises none."""

import json
import time

import pytest
import torch

from helpers import REPO_ROOT
from helpers.params_edits import refusal
from helpers.pipeline_fixture import recompose
from minigpt.core.config import load_params
from minigpt.data import batching
from minigpt.train import schedule_spec, train_step
from minigpt.train.loop import train
from minigpt.train.watchdogs import LEVELS, Watchdogs, WatchdogStop

# The throughput watchdog compares each window with the run's first one; on a shared CI machine a later window can
# really be 2x slower than the first (a CI run saw two such warnings on top of the two it counted). The tests that
# count warnings of other watchdogs set it to fire only below 1% of the first window; the throughput test puts the
# shipped fraction back.
FAST = ["train.max_steps=60", "train.eval_every=10", "train.eval_batches=2", "train.sample_length=10",
        "watch.window=20", "watch.throughput_fraction=0.01"]


def defaults(**overrides):
    watch = load_params(REPO_ROOT / "params.yaml").watch
    return watch.model_copy(update=overrides)


def dogs(**overrides):
    return Watchdogs(defaults(**overrides), grad_clip=1.0, placeholder="\ufffd", say=lambda _m: None)


class FakeOptimizer:
    def __init__(self, *lrs):
        self.param_groups = [{"lr": lr} for lr in lrs]


def tiny_model():
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    return model


def step(d, n, lr=1e-3, optimizer=None, model=None, norm=0.5, loss=2.0, rate=1000.0):
    return d.after_step(n, lr, optimizer or FakeOptimizer(lr, lr), model or tiny_model(), norm, loss, rate)


def read_log(root):
    return [json.loads(line) for line in (root / "reports/train_log.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------- each watchdog, alone

def test_lr_applied_stops_when_a_group_applies_another_lr():
    d = dogs()
    assert step(d, 1) == []
    with pytest.raises(WatchdogStop, match=r"watchdog lr_applied stopped the run at step 2: at step 2 optimizer "
                                           r"group 1 applied lr 0.0005 but the specified schedule says 0.001"):
        step(d, 2, optimizer=FakeOptimizer(1e-3, 5e-4))


def test_gradient_flow_stops_after_dead_steps_in_a_row():
    d = dogs(dead_grad_steps=3)
    model = tiny_model()
    step(d, 1, model=model, norm=0.0)
    step(d, 2, model=model, norm=0.0)
    step(d, 3, model=model, norm=0.4)  # a live step resets the count
    model.bias.grad = None
    step(d, 4, model=model)
    step(d, 5, model=model)
    with pytest.raises(WatchdogStop,
                       match=r"gradient_flow .* no gradient for bias for 3 steps in a row \(steps 4..6\)"):
        step(d, 6, model=model)


def test_clipping_share_and_throughput_warn_once_per_window():
    said = []
    d = Watchdogs(defaults(window=10, settle_steps=0, clip_share_max=0.5, throughput_fraction=0.5), 1.0, "\ufffd",
                  2000.0, said.append)
    events = [e for n in range(1, 11) for e in step(d, n, norm=3.0, rate=900.0)]
    assert [e["name"] for e in events] == ["clipping_share", "throughput"]
    expected = "100% of the last 10 steps were clipped at grad_clip 1 (median gradient norm 3, lr 0.001)"
    assert expected in events[0]["message"]
    expected = "median 900 tokens/s over the last 10 steps, below 0.5 x the `make machine` figure, 2,000"
    assert expected in events[1]["message"]
    events = [e for n in range(11, 21) for e in step(d, n, norm=3.0, rate=900.0)]
    assert len(events) == 2 and len(said) == 2, "every firing is an event; the console hears of each watchdog once"
    assert d.summary()["warnings"] == 4 and d.summary()["checks"]["throughput"]["first_step"] == 10


def test_throughput_without_preflight_timing_compares_with_the_first_window():
    d = dogs(window=5, throughput_fraction=0.5)
    assert [e for n in range(1, 6) for e in step(d, n, rate=1000.0)] == []
    assert d.summary()["reference"] == "run's first window" and d.reference_tokens_per_s == 1000.0
    assert [e["name"] for n in range(6, 11) for e in step(d, n, rate=400.0)] == ["throughput"]


def test_val_improving_warns_when_the_loss_stops_falling():
    d = dogs(first_evals=3, val_margin=0.05)
    assert d.after_eval(10, 3.0, None) == [] and d.after_eval(20, 2.9, None) == []
    events = d.after_eval(30, 2.97, None)
    assert [e["name"] for e in events] == ["val_improving"]
    assert "after 3 evals the val loss is 2.9700, not 0.05 below the first eval's 3.0000" in events[0]["message"]
    assert dogs().after_eval(10, 3.0, None) == []


def test_val_improving_under_the_ngram_expert_judges_the_mixture_against_the_ngram_alone():
    # the expert run seen on wt2-mini: first eval 1.5096, third 1.4917 (0.018 below), the 9-gram alone about 1.557
    learning = dogs(first_evals=3, val_margin=0.05)
    learning.ngram_val_loss = 1.557
    assert [e for loss in (1.5096, 1.4990, 1.4917) for e in learning.after_eval(10, loss, None)] == []
    stuck = dogs(first_evals=3, val_margin=0.05)  # a mixture that never gets past the n-gram: the network adds nothing
    stuck.ngram_val_loss = 1.557
    events = [e for loss in (1.560, 1.540, 1.530) for e in stuck.after_eval(10, loss, None)]
    assert [e["name"] for e in events] == ["val_improving"]
    assert "not 0.05 below the n-gram alone's 1.5570" in events[0]["message"]
    assert "the network adds nothing to the n-gram" in events[0]["message"]


def test_train_diverging_stops_after_rising_evals_in_a_row():
    d = dogs(rising_evals=2, rise_tolerance=0.02)
    for n, loss in ((1, 2.0), (2, 1.9), (3, 1.95), (4, 2.1)):  # eval means 2.0 -> 1.9 (falls) -> ...
        step(d, n, loss=loss)
        if n < 4:
            d.after_eval(n, 2.0, None)
    with pytest.raises(WatchdogStop, match=r"train_diverging stopped the run at step 4: the mean train loss rose at 2 "
                                           r"evals in a row \(1.9000, 1.9500, 2.1000 nats\)"):
        d.after_eval(4, 2.0, None)


def test_sample_probe_warns_on_a_loop_or_placeholders():
    d = dogs(first_evals=2, max_repeat_share=0.6, max_placeholder_share=0.05)
    assert d.after_eval(10, 3.0, "the the the the the the the the ") == [], \
        "the first eval's sample is not judged for loops"
    events = d.after_eval(20, 2.0, "the the the the the the the the ")
    assert [e["name"] for e in events] == ["sample_probe"]
    assert "4-grams repeat (above 60%: a loop)" in events[0]["message"]
    events = d.after_eval(30, 1.9, "A \ufffd\ufffd\ufffd city in \ufffd")
    assert "of it is the placeholder" in events[0]["message"]
    assert d.after_eval(40, 1.8, "The Boat Race is an annual rowing race between Oxford and Cambridge") == []


# ------------------------------------------------------------------------------------- planted bugs in the loop

def test_an_applied_lr_that_differs_from_the_schedule_stops_the_run(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    real = train_step.training_step

    def halves_the_second_group(model, optimizer, inputs, targets, lr, *args, **kwargs):
        result = real(model, optimizer, inputs, targets, lr, *args, **kwargs)
        optimizer.param_groups[1]["lr"] = lr / 2  # e.g. a second scheduler writing into the groups
        return result

    monkeypatch.setattr(train_step, "training_step", halves_the_second_group)
    with pytest.raises(WatchdogStop) as info:
        train(params, root, require_gate=False, out=lambda _m: None)
    assert str(info.value).startswith("watchdog lr_applied stopped the run at step 1: at step 1 optimizer group 1")
    assert "no checkpoint was written yet" in str(info.value)
    assert read_log(root)[-1]["watch"][0]["name"] == "lr_applied"


def test_a_loop_that_applies_the_schedule_one_step_late_is_stopped_by_lr_applied(project, monkeypatch):
    """The schedule as the step computes it is shifted by one step (preflight's rehearsal only bounds the LRs it
    applies): every group agrees with the step's own value, so only the specification from params, an
    implementation of its own, can see it."""
    root, source = project
    params = recompose(root, source, FAST)
    real = train_step.ScheduledStep.lr_at
    monkeypatch.setattr(train_step.ScheduledStep, "lr_at", lambda self, step, fraction=0.0: real(self, step - 1,
                                                                                                 fraction))
    with pytest.raises(WatchdogStop) as info:
        train(params, root, require_gate=False, out=lambda _m: None)
    assert str(info.value).startswith("watchdog lr_applied stopped the run at step 1: at step 1 optimizer group 0 "
                                      "applied lr 0 but the specified schedule says")


def test_a_step_whose_gradients_vanish_stops_with_the_last_checkpoint_kept(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    real = train_step.training_step
    calls = []

    def vanishing(model, optimizer, inputs, targets, *args, **kwargs):
        calls.append(1)
        if len(calls) > 25:  # the loss scaled by 0 from step 26 on: every gradient is exactly 0
            monkeypatch.setattr(model, "forward", scaled_forward(model))
        return real(model, optimizer, inputs, targets, *args, **kwargs)

    monkeypatch.setattr(train_step, "training_step", vanishing)
    with pytest.raises(WatchdogStop) as info:
        train(params, root, require_gate=False, out=lambda _m: None)
    message = str(info.value)
    assert ("watchdog gradient_flow stopped the run at step 28: the gradient norm is exactly 0 for 3 steps in a "
            "row") in message
    assert "the last good checkpoint" in message and "(step 20) is left intact" in message


def scaled_forward(model):
    forward = type(model).forward

    def zero_loss(inputs, targets=None):
        logits, loss = forward(model, inputs, targets)
        return logits, None if loss is None else loss * 0.0
    return zero_loss


def test_a_loss_that_stops_improving_warns(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    real = train_step.cosine_with_warmup
    # the LR at 0 from step 11 on, as specified (the applied LR follows the specification, so only the loss tells)
    monkeypatch.setattr(train_step, "cosine_with_warmup",
                        lambda step, *a, **k: real(step, *a, **k) if step <= 10 else 0.0)
    specified = schedule_spec.specified_lr
    monkeypatch.setattr(schedule_spec, "specified_lr", lambda cfg, step, f=0.0: specified(cfg, step, f) if step <= 10
                        else 0.0)
    messages = []
    summary = train(params, root, require_gate=False, out=messages.append)
    checks = summary["watchdogs"]["checks"]
    assert checks["val_improving"]["fired"] >= 1 and checks["val_improving"]["first_step"] == 30
    assert sum("watchdog warning (val_improving)" in m for m in messages) == 1, "once on the console"
    fired = [e["name"] for r in read_log(root) for e in r.get("watch", [])]
    assert summary["warnings"] >= 1 and "val_improving" in fired


def test_a_loss_that_rises_for_several_evals_stops_as_diverging(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST + ["train.max_steps=200", "watch.rising_evals=2"])
    real = train_step.cosine_with_warmup
    # after step 60 the LR climbs far above anything this model tolerates (clipping keeps it finite)
    monkeypatch.setattr(train_step, "cosine_with_warmup",
                        lambda step, *a, **k: real(step, *a, **k) if step <= 60 else 0.003 * 1.08 ** (step - 60))
    specified = schedule_spec.specified_lr  # as specified: only the loss tells
    monkeypatch.setattr(schedule_spec, "specified_lr", lambda cfg, step, f=0.0: specified(cfg, step, f) if step <= 60
                        else 0.003 * 1.08 ** (step - 60))
    with pytest.raises(WatchdogStop) as info:
        train(params, root, require_gate=False, out=lambda _m: None)
    assert "watchdog train_diverging stopped the run at step" in str(info.value)
    assert "the mean train loss rose at 2 evals in a row" in str(info.value)


def test_clipping_on_every_step_warns_naming_the_lr_and_median_norm(project):
    root, source = project
    params = recompose(root, source, FAST + ["train.grad_clip=0.001", "train.max_steps=160"])
    summary = train(params, root, require_gate=False, out=lambda _m: None)
    check = summary["watchdogs"]["checks"]["clipping_share"]
    # windows 101-120, 121-140, 141-160: the ones past watch.settle_steps (100)
    assert check["evaluated"] == 3 and check["fired"] == 3 and check["first_step"] == 120
    assert "100% of the last 20 steps were clipped at grad_clip 0.001 (median gradient norm" in check["first_message"]


def test_a_loop_slowed_on_purpose_warns_on_throughput(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST + ["watch.throughput_fraction=0.5"])
    real = batching.get_batch
    first_window = 20 + params.train.eval_batches  # the fixed val batches are drawn first, then one per step
    calls = []

    def slowed(*args, **kwargs):
        calls.append(time.perf_counter())
        if len(calls) > first_window:
            # each later step takes 3x longer than the first window's mean step, whatever the CPU's speed
            step_s = (calls[first_window - 1] - calls[params.train.eval_batches]) / 19
            time.sleep(3 * step_s)
        return real(*args, **kwargs)

    monkeypatch.setattr(batching, "get_batch", slowed)
    summary = train(params, root, require_gate=False, out=lambda _m: None)
    check = summary["watchdogs"]["checks"]["throughput"]
    assert check["fired"] == 2 and check["first_step"] == 40 and "first window" in check["first_message"]
    assert "likely other processes on the cores" in check["first_message"]


def test_placeholders_in_the_sample_warn(project):
    root, source = project
    params = recompose(root, source, FAST + ["train.sample_prompt='\ufffd\ufffd\ufffd\ufffd'"])
    summary = train(params, root, require_gate=False, out=lambda _m: None)
    assert summary["watchdogs"]["checks"]["sample_probe"]["fired"] == 6
    assert "of it is the placeholder" in summary["watchdogs"]["checks"]["sample_probe"]["first_message"]


def test_a_healthy_run_raises_no_warning_and_records_every_watchdog(project):
    root, source = project
    params = recompose(root, source, FAST)
    summary = train(params, root, require_gate=False, out=lambda _m: None)
    assert summary["warnings"] == 0 and set(summary["watchdogs"]["checks"]) == set(LEVELS)
    assert all(c["fired"] == 0 for c in summary["watchdogs"]["checks"].values())
    evaluated = {name: c["evaluated"] for name, c in summary["watchdogs"]["checks"].items()}
    assert evaluated == {"lr_applied": 60, "gradient_flow": 60, "val_improving": 4, "train_diverging": 5,
                         "clipping_share": 0, "throughput": 2, "sample_probe": 6}
    assert not any("watch" in r for r in read_log(root))
    assert json.loads((root / "reports/train_summary.json").read_text())["warnings"] == 0


def test_a_stop_at_an_eval_leaves_the_previous_checkpoint(project, monkeypatch):
    root, source = project
    params = recompose(root, source, FAST)
    import minigpt.train.watchdogs as watchdogs

    def stop_at_step_30(self, step, val_loss, sample):
        if step == 30:
            self._stop(step, "train_diverging", "planted")
        return []

    monkeypatch.setattr(watchdogs.Watchdogs, "after_eval", stop_at_step_30)
    with pytest.raises(WatchdogStop, match=r"\(step 20\) is left intact"):
        train(params, root, require_gate=False, out=lambda _m: None)
    assert read_log(root)[-1]["step"] == 30 and read_log(root)[-1]["watch"][0]["name"] == "train_diverging"


def test_the_pages_show_warnings_and_stops(project, monkeypatch):
    from minigpt.report.compare import compare_page
    from minigpt.report.decision import decision_metrics, dvc_metrics
    from minigpt.report.run_files import load_run, workspace_reader
    from minigpt.report.run_page import run_page

    root, source = project
    train(recompose(root, source, FAST + ["train.grad_clip=0.001", "train.max_steps=140"]), root,
          require_gate=False, out=lambda _m: None)
    warned = load_run("warned", workspace_reader(root))
    assert decision_metrics(warned)["warnings"] == 2 and "warnings" not in dvc_metrics(decision_metrics(warned))
    html = run_page(warned)
    assert "Warnings: clipping_share</span> (the run went on" in html and '<table class="watchdogs">' in html
    row = '<tr class="failed-row"><td>clipping_share</td><td>warning</td><td class="num">2</td><td class="num">2</td>'
    assert row in html

    (root / "reports/train_summary.json").unlink()
    (root / "models/mini_gpt_latest.pt").unlink()
    schedule = train_step.cosine_with_warmup
    monkeypatch.setattr(train_step, "cosine_with_warmup",
                        lambda *a, **k: float("nan") if a[0] == 5 else schedule(*a, **k))
    real = train_step.training_step
    monkeypatch.setattr(train_step, "training_step",
                        lambda m, o, x, y, lr, *a, **k: real(m, o, x, y, lr if lr == lr else 1e-3, *a, **k))
    with pytest.raises(WatchdogStop):
        train(recompose(root, source, FAST), root, require_gate=False, out=lambda _m: None)
    stopped = load_run("stopped", workspace_reader(root))
    assert "Stopped by the lr_applied watchdog at step 5</span>" in run_page(stopped)
    assert decision_metrics(stopped)["warnings"] == 0
    both = compare_page([warned, stopped])
    assert "<h2>Watchdogs</h2>" in both and "stop ×1</span> (step 5)" in both and "warning ×2</span> (step 120)" in both


@pytest.mark.parametrize("key,value,message", [
    ("window", 0, "'watch.window' = 0 is invalid; it must be >= 1"),
    ("clip_share_max", 1.5, "'watch.clip_share_max' = 1.5 is invalid; it must be in [0, 1]"),
    ("first_evals", 1, "'watch.first_evals' = 1 is invalid; it must be >= 2"),
])
def test_watchdog_settings_are_validated_by_name(key, value, message):
    assert message in refusal("watch", key, value)


# ------------------------------------------------------------------------- preflight's self-test of the watchdogs

def circular_lr_applied(real):
    """after_step handed the optimizer's own LR as the specification: lr_applied compares a value with itself."""
    def after_step(self, step, lr, optimizer, *rest):
        return real(self, step, optimizer.param_groups[0]["lr"], optimizer, *rest)
    return after_step


def test_a_watchdog_that_compares_a_value_with_itself_fails_preflight_by_name(project, monkeypatch):
    from minigpt.preflight.suite import run_preflight

    root, source = project
    params = recompose(root, source, [])
    monkeypatch.setattr(Watchdogs, "after_step", circular_lr_applied(Watchdogs.after_step))
    report = run_preflight(params, root)
    assert report["failed"] == ["watchdogs_fire"]
    check = next(c for c in report["checks"] if c["name"] == "watchdogs_fire")
    assert check["message"].startswith("lr_applied did not fire on readings that break its rule")
    assert check["measured"]["fired"]["lr_applied"] == []


def watchdogs_ctx(*overrides):
    from types import SimpleNamespace

    params = load_params(REPO_ROOT / "params.yaml")
    return SimpleNamespace(params=params.model_copy(update={"watch": defaults(**dict(overrides))}))


@pytest.mark.parametrize("plant,message", [
    ("muted_sample_probe", "sample_probe did not fire on readings that break its rule"),
    ("inverted_val", "val_improving fired on healthy readings"),
])
def test_a_watchdog_muted_or_inverted_is_named_by_the_self_test(monkeypatch, plant, message):
    from minigpt.preflight.checks import CheckFailed
    from minigpt.preflight.watchdog_check import check_watchdogs_fire

    if plant == "muted_sample_probe":
        monkeypatch.setattr(Watchdogs, "_sample_checks", lambda self, step, sample: [])
    else:
        real = Watchdogs.after_eval
        monkeypatch.setattr(Watchdogs, "after_eval", lambda self, step, val, sample: real(self, step, -val, sample))
    with pytest.raises(CheckFailed, match=message):
        check_watchdogs_fire(watchdogs_ctx())


def test_the_self_test_passes_the_shipped_thresholds_and_records_a_watchdog_turned_off():
    from minigpt.preflight.watchdog_check import check_watchdogs_fire

    shipped = check_watchdogs_fire(watchdogs_ctx())
    assert shipped["fired"] == {name: [name] for name in LEVELS}, "each stream breaks one rule, and fires its dog alone"
    assert all(shipped["judged_on_healthy"].values()) and shipped["fired_on_healthy"] == []
    off = check_watchdogs_fire(watchdogs_ctx(("clip_share_max", 1.0)))
    assert off["off_by_configuration"] == ["clipping_share"] and "clipping_share" not in off["fired"]
