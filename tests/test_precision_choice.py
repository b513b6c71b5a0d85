"""train.precision: auto — `make machine` times fp32 and bf16 steps of the preset's model on this machine and composes
the faster into params.yaml; a run refuses an auto that is still auto; evaluation chooses its own precision from its
forward passes."""

import shutil

import pytest
import torch

from helpers import REPO_ROOT
from helpers.machines import AVX2_ONLY, WITH_BF16
from helpers.pipeline_fixture import recompose
from helpers.tiny_models import small_config
from minigpt.core.choice_text import how_chosen
from minigpt.core.errors import ConfigError
from minigpt.core.machine import CpuInfo, bf16_emulated, cpu_info
from minigpt.model import precision
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.suite import run_preflight
from minigpt.train.loop import train
from minigpt.train.precision_choice import measure_training

FAST = ["train.max_steps=20", "train.warmup_steps=5", "train.eval_every=10", "train.eval_batches=2",
        "train.sample_length=0", "preflight.overfit_steps=30", "preflight.overfit_threshold=5.0"]




@pytest.fixture(autouse=True)
def cpu_with_bf16_instructions(monkeypatch):
    """These tests are about timing, so they run as if on a CPU where bf16 is worth timing, whatever CPU runs them
    (on one without bf16 instructions auto takes fp32 without timing: the tests at the end)."""
    monkeypatch.setattr(precision, "cpu_info", lambda: WITH_BF16)


def force(monkeypatch, fp32_s: float, bf16_s: float, calls: list | None = None):
    """Make the timing report these seconds per step (the real timing is exercised by the first test)."""
    def timed(run_once, device, precisions=("fp32", "bf16")):
        if calls is not None:
            calls.append(precisions)
        return {p: {"fp32": fp32_s, "bf16": bf16_s}[p] for p in precisions}
    monkeypatch.setattr(precision, "interleaved_seconds", timed)


def test_auto_times_both_precisions_and_the_faster_wins(project):
    root, source = project
    params = recompose(root, source, FAST + ["train.precision=auto", "machine=none"])
    timing = measure_training(params, 64, torch.device("cpu"))  # real timing
    assert timing["configured"] == "auto" and timing["choice"] in ("fp32", "bf16")
    assert timing["fp32_tokens_per_s"] > 0 and timing["bf16_tokens_per_s"] > 0
    faster = "bf16" if timing["bf16_tokens_per_s"] > timing["fp32_tokens_per_s"] else "fp32"
    assert timing["choice"] == faster and timing["tokens_per_s"] == timing[f"{faster}_tokens_per_s"]


@pytest.mark.parametrize("fp32_s,bf16_s,expected", [(2.0, 1.0, "bf16"), (1.0, 2.0, "fp32")])
def test_make_machine_composes_the_faster_precision_into_the_default_preset(tmp_path, monkeypatch, fp32_s, bf16_s,
                                                                            expected):
    from minigpt.core.compose import compose_params
    from minigpt.core.config import load_params
    from minigpt.train.machine_choice import verify_machine_choice
    from minigpt.train.machine_command import measure_machine

    conf = tmp_path / "conf"
    shutil.copytree(REPO_ROOT / "conf", conf)
    calls = []
    force(monkeypatch, fp32_s, bf16_s, calls)
    measure_machine(conf, force=True, say=lambda _m: None)
    assert ("fp32", "bf16") in calls
    compose_params(tmp_path / "params.yaml", conf, [])
    params = load_params(tmp_path / "params.yaml")
    assert params.train.precision == expected == params.machine.precision
    assert params.machine.timed is not None and f"fp32 {1 / fp32_s * 32 * 128:,.0f}" in params.machine.how
    assert verify_machine_choice(params) == params.machine
    # an explicit precision replaces the choice: nothing of it is used
    compose_params(tmp_path / "explicit.yaml", conf, ["train.precision=" + ("fp32" if expected == "bf16" else "bf16")])
    assert verify_machine_choice(load_params(tmp_path / "explicit.yaml")) is None


def test_an_auto_that_is_still_auto_is_refused(project):
    root, source = project
    params = recompose(root, source, FAST + ["train.precision=auto", "machine=none"])
    with pytest.raises(ConfigError, match=r"'train.precision' is auto but no choice measured on this machine"):
        train(params, root, require_gate=False, out=lambda _m: None)
    with pytest.raises(ConfigError, match=r"'train.precision' is auto"):
        run_preflight(params, root)


def test_evaluation_chooses_its_precision_from_its_own_forward_passes(monkeypatch):
    model = MiniGPT(small_config()).eval()
    cpu = torch.device("cpu")
    assert precision.choose_evaluation_precision(model, "bf16", 4, cpu) == {"configured": "bf16", "choice": "bf16"}
    timing = precision.choose_evaluation_precision(model, "auto", 4, cpu)  # real timing
    assert timing["choice"] in ("fp32", "bf16") and timing["fp32_tokens_per_s"] > 0
    force(monkeypatch, 1.0, 3.0)
    assert precision.choose_evaluation_precision(model, "auto", 4, cpu)["choice"] == "fp32"


# ------------------------------------------------------------------ a CPU without bf16 instructions times nothing

@pytest.mark.parametrize("flags,emulated", [
    ({"sse2", "avx2"}, True),  # AVX2 only (the AMD EPYC family 25 model 1)
    ({"sse2", "avx2", "avx512f"}, True),  # AVX-512 without its bf16 extension
    ({"sse2", "avx2", "avx512f", "avx512_bf16"}, False),
    ({"sse2", "avx2", "amx_bf16", "amx_tile"}, False),
    (set(), False),  # flags unknown: time it
    ({"fp", "asimd", "bf16"}, False),  # not x86: time it
])
def test_bf16_is_emulated_only_on_an_x86_cpu_without_bf16_instructions(flags, emulated):
    assert bf16_emulated(CpuInfo("cpu", "?/?", frozenset(flags))) is emulated


def test_cpu_info_reads_the_name_family_model_and_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    core = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n" \
           "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma\n\n"
    cpuinfo.write_text(core.format(n=0) + core.format(n=1))
    info = cpu_info(cpuinfo)
    assert (info.name, info.family_model) == ("AMD EPYC 7B13", "25/1")
    assert info.flags == {"fpu", "sse2", "avx2", "fma"} and bf16_emulated(info)
    missing = cpu_info(tmp_path / "absent")
    assert missing.flags == frozenset() and missing.family_model == "?/?" and not bf16_emulated(missing)


def test_on_a_cpu_without_bf16_instructions_auto_is_fp32_without_any_timing(monkeypatch):
    monkeypatch.setattr(precision, "cpu_info", lambda: AVX2_ONLY)
    calls = []
    force(monkeypatch, 2.0, 1.0, calls)  # bf16 "faster" if anything were timed
    chosen = precision.without_timing("auto", torch.device("cpu"))
    assert chosen["choice"] == "fp32" and "no bf16 instructions" in chosen["reason"]
    assert how_chosen(chosen).startswith("auto: this CPU has no bf16 instructions")
    model = MiniGPT(small_config()).eval()
    assert precision.choose_evaluation_precision(model, "auto", 4, torch.device("cpu"))["choice"] == "fp32"
    assert calls == []


def test_a_budget_shape_is_timed_in_fp32_alone_on_a_cpu_without_bf16_instructions(project, monkeypatch):
    root, source = project
    calls = []
    force(monkeypatch, 2.0, 1.0, calls)
    params = recompose(root, source, FAST + ["train.precision=auto", "machine=none"])
    cpu = torch.device("cpu")
    assert measure_training(params, 64, cpu)["choice"] == "bf16" and calls == [("fp32", "bf16")]
    monkeypatch.setattr(precision, "cpu_info", lambda: AVX2_ONLY)
    assert measure_training(params, 64, cpu)["choice"] == "fp32" and calls[1:] == [("fp32",)]
