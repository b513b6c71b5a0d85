"""The run's code is bound: dvc.yaml's code deps are each script's import closure, the gate refuses a report
from other code (naming the files), and auto-resume never continues a checkpoint written by other code."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import REPO_ROOT
from helpers.pipeline_fixture import recompose
from minigpt.core import code_binding
from minigpt.core.code_binding import import_closure, run_code_files
from minigpt.model.checkpoint import CheckpointError
from minigpt.model.gpt import MiniGPT
from minigpt.preflight.suite import run_preflight
from minigpt.train.gate import GateError, verify_gate
from minigpt.train.loop import train

FAST = ["train.max_steps=40", "train.eval_every=20", "train.eval_batches=2", "train.sample_length=0"]


def dvc_stages():
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]


def code_deps(stage: dict) -> set[str]:
    return {d for d in stage["deps"] if d.startswith(("stages/", "minigpt/", "conf/"))}


def as_dvc_deps(files) -> set[str]:
    """A closure as dvc.yaml lists it: a file of a minigpt subpackage becomes its package folder."""
    parts = [Path(f).parts for f in files]
    return {"/".join(p[:2]) if p[0] == "minigpt" and len(p) > 2 else "/".join(p) for p in parts}


@pytest.mark.parametrize("name", list(dvc_stages()))
def test_dvc_code_deps_are_the_packages_of_the_stage_scripts_import_closure(name):
    stage = dvc_stages()[name]
    script = stage["cmd"].split()[-1]
    expected = as_dvc_deps(run_code_files() if name == "preflight" else import_closure(script))
    assert script in expected
    assert code_deps(stage) == expected, (
        f"dvc.yaml stage {name}: missing {sorted(expected - code_deps(stage))}, extra "
        f"{sorted(code_deps(stage) - expected)}")


def test_a_package_folder_dep_ignores_bytecode():
    """DVC hashes every file of a folder dep: __pycache__ must not make a stage look changed."""
    ignored = (REPO_ROOT / ".dvcignore").read_text().split()
    assert "__pycache__/" in ignored and "*.pyc" in ignored


def test_preflight_binds_the_train_scripts_code_too():
    """DVC reruns train when its code changes; preflight must rerun too, or the gate (rightly) refuses."""
    assert set(import_closure("stages/train.py")) <= set(run_code_files())
    assert "minigpt/train/train_step.py" in import_closure("stages/train.py")
    assert {"minigpt/train/train_step.py",
            "minigpt/preflight/training_checks.py"} <= set(import_closure("stages/preflight.py"))


@pytest.mark.parametrize("name", list(dvc_stages()))
def test_the_static_closure_holds_every_module_python_really_imports(name):
    script = REPO_ROOT / dvc_stages()[name]["cmd"].split()[-1]
    probe = ("import importlib.util, sys\n"
             f"spec = importlib.util.spec_from_file_location('stage_under_test', {str(script)!r})\n"
             "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
             "print('\\n'.join(sorted(m.__file__ for n, m in sys.modules.items()"
             " if n == 'minigpt' or n.startswith('minigpt.'))))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    imported = {str(Path(f).resolve().relative_to(REPO_ROOT)) for f in result.stdout.split()}
    assert imported and imported <= set(import_closure(script.relative_to(REPO_ROOT)))


@pytest.fixture
def code_copy(tmp_path, monkeypatch):
    """The run's code copied to its own checkout, which the code fingerprint then reads."""
    root = tmp_path / "code"
    for folder in ("stages", "minigpt", "conf"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(code_binding, "CODE_ROOT", root)
    return root


def edit(path):
    path.write_text(path.read_text() + "\n# an edit\n")


def test_the_gate_refuses_a_report_written_by_other_code_and_names_the_files(project, code_copy):
    root, source = project
    params = recompose(root, source, FAST)
    report = run_preflight(params, root)
    assert report["passed"] and set(report["fingerprints"]["code"]["files"]) == set(run_code_files())
    verify_gate(params, root)
    edit(code_copy / "minigpt/model/gpt.py")
    edit(code_copy / "minigpt/train/train_step.py")
    with pytest.raises(GateError,
                       match=r"mismatched fingerprint: code \(minigpt/model/gpt.py, minigpt/train/train_step.py\)"):
        verify_gate(params, root)
    with pytest.raises(GateError, match="dvc repro preflight"):
        train(params, root, out=lambda _m: None)


def test_the_overfit_checks_debug_model_comes_from_params_and_is_bound_by_the_gate(project):
    """preflight.overfit_model is composed into params.yaml (the library never reads conf/): the check trains the
    model it names, and a report made for another overfit model is refused."""
    root, source = project
    params = recompose(root, source, [*FAST, "preflight.overfit_model.embedding_dim=32"])
    report = run_preflight(params, root)
    overfit = next(c for c in report["checks"] if c["name"] == "single_batch_overfit")
    assert overfit["measured"]["model"]["embedding_dim"] == 32, "the check trains the model params.yaml names"
    assert set(report["fingerprints"]["code"]["files"]) == set(run_code_files())
    assert not any(name.startswith("conf/") for name in run_code_files())
    params = recompose(root, source, FAST)
    with pytest.raises(GateError, match=r"mismatched fingerprint: config \(preflight.overfit_model"):
        verify_gate(params, root)


def test_a_report_that_is_not_an_object_is_refused_clearly(project):
    root, source = project
    params = recompose(root, source, FAST)
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports/debug_report.json").write_text("null")
    with pytest.raises(GateError, match="not a debug report"):
        verify_gate(params, root)


def read_steps(root):
    return [json.loads(line)["step"] for line in (root / "reports/train_log.jsonl").read_text().splitlines()]


def test_auto_resume_never_continues_a_checkpoint_of_other_code(project, code_copy):
    root, source = project
    params = recompose(root, source, FAST)
    train(params, root, require_gate=False, out=lambda _m: None)

    messages = []
    again = train(params, root, require_gate=False, out=messages.append)
    assert any("already finished this exact run" in m for m in messages), messages
    assert again["resumed_from_step"] == 40

    edit(code_copy / "minigpt/model/gpt.py")
    messages = []
    fresh = train(params, root, require_gate=False, out=messages.append)
    assert any("not resuming" in m and "other code (changed: minigpt/model/gpt.py)" in m for m in messages), messages
    assert fresh["resumed_from_step"] is None and fresh["steps"] == 40
    assert read_steps(root) == list(range(1, 41)), "a fresh run, not zero steps resumed"


class StopsAtStep25(MiniGPT):
    """Training dies in its 25th step (the latest checkpoint is step 20's), as a killed run would."""

    calls = 0

    def forward(self, inputs, targets=None, cache=None):
        if self.training:
            StopsAtStep25.calls += 1
            if StopsAtStep25.calls == 25:
                raise RuntimeError("killed")
        return super().forward(inputs, targets, cache)


def test_explicit_resume_from_continues_across_a_code_change_and_says_so(project, code_copy):
    root, source = project
    latest = root / "models/mini_gpt_latest.pt"
    with pytest.raises(RuntimeError, match="killed"):
        train(recompose(root, source, FAST), root, require_gate=False, model_factory=StopsAtStep25, out=lambda _m: None)
    edit(code_copy / "minigpt/model/gpt.py")
    explicit = recompose(root, source, FAST + [f"train.resume_from={latest}"])
    messages = []
    summary = train(explicit, root, require_gate=False, out=messages.append)
    said = "across a code change (changed: minigpt/model/gpt.py)"
    assert any("continuing" in m and said in m for m in messages), messages
    assert summary["resumed_from_step"] == 20 and summary["steps"] == 40

    with pytest.raises(CheckpointError, match="already at step 40 .* nothing left to train"):
        train(explicit, root, require_gate=False, out=lambda _m: None)


def test_a_long_list_of_changed_files_is_named_in_one_short_line():
    files = [f"minigpt/pkg/module_{i}.py" for i in range(40)]
    line = code_binding.name_files(files)
    assert line.startswith("minigpt/pkg/module_0.py, ") and line.endswith(" and 32 more") and len(line) < 300
    assert code_binding.name_files(files[:2]) == "minigpt/pkg/module_0.py, minigpt/pkg/module_1.py"
