"""The README's shell blocks, run line by line as a user runs them, so the README stays true (slow tier).

They run in a scratch copy of the project, on the fixture corpus and at fixture scale; what differs from the README,
and only this: `make repro` gets `DATA=<fixture> OVERRIDES=experiment=debug` and this test's virtual environment;
each `dvc exp run` that composes gets the fixture's data overrides (and `experiment=debug` where it names no
experiment); the budget shape `small` is made tiny and budget-72s's clock cut to 8 s; the placeholders `<exp-a>` …
are the experiments the lines before made; to give the seed-group line its groups, seeds 2 and 3 of two of the
sweep's LRs are queued beside the sweep; `make test` is this suite, not run again."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT
from helpers.dvc_project import DvcProject
from helpers.machines import TINY_SMALL

pytestmark = pytest.mark.slow

PLACEHOLDER = re.compile(r"^<[\w-]+>$")
SWEEP_SEEDS = ("2", "3")


def readme_commands(text: str) -> list[str]:
    """Every command line of the README's ```bash blocks, its trailing comment removed."""
    commands, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside and line.strip() == "```bash"
            continue
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if inside and command:
            commands.append(command)
    return commands


def as_run_here(command: str, fixture: Path, venv: Path, names: dict[int, list[str]]) -> list[str] | None:
    """The README's command as this test runs it (the module docstring lists every difference); None: not run."""
    words = shlex.split(command)
    if words[:2] == ["make", "test"]:
        return None
    if words[:2] == ["make", "repro"]:
        return ["make", "-o", str(venv / ".minigpt-installed"), "repro", f"VENV={venv}", f"DATA={fixture}",
                "OVERRIDES=experiment=debug"]
    if words[:3] == ["dvc", "exp", "run"] and "-S" in words:
        words += ["-S", "data=local", "-S", f"data.path={fixture}"]
        if not any(word.startswith("experiment=") for word in words):
            words += ["-S", "experiment=debug"]
    placeholders = [word for word in words if PLACEHOLDER.match(word)]
    if placeholders:
        chosen = iter(names[len(placeholders)])
        words = [next(chosen) if PLACEHOLDER.match(word) else word for word in words]
    if words[0] == "dvc":
        words = [sys.executable, "-m", "dvc", *words[1:]]
    elif words[0] == "python":
        words = [sys.executable, *words[1:]]
    return words


def experiment_names(project: DvcProject) -> dict[tuple[float, int], str]:
    """(train.lr, train.seed) -> experiment name, for every experiment of the workspace's commit."""
    shown = json.loads(project.dvc("exp", "show", "--json").stdout)
    found = {}
    for rev in shown:
        for experiment in rev.get("experiments") or []:
            for run in experiment["revs"]:
                if run.get("name") and not run.get("error"):  # a run the gate refused has an error
                    train = run["data"]["params"]["params.yaml"]["data"]["train"]
                    found[(float(train["lr"]), int(train["seed"]))] = run["name"]
    return found


def test_the_readme_commands_run_as_written_on_the_fixture(tmp_path, fixture_dir):
    project = DvcProject(tmp_path / "project", ["experiment=debug", "data=local", f"data.path={fixture_dir}"])
    root, venv = project.root, Path(sys.prefix)
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy2(REPO_ROOT / name, root / name)
    (root / "conf/shape/small.yaml").write_text(TINY_SMALL)
    preset = root / "conf/experiment/budget-72s.yaml"
    preset.write_text(preset.read_text().replace("max_seconds: 72", "max_seconds: 8"))
    project.git("add", "-A")
    project.git("commit", "-q", "-m", "the project at fixture scale")

    commands = readme_commands((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert commands[:2] == ["make repro", "make test"] and any("--queue" in c for c in commands), commands
    names: dict[int, list[str]] = {}
    outputs, sweep = {}, []
    for command in commands:
        words = as_run_here(command, fixture_dir, venv, names)
        if words is None:
            continue
        result = project.run(*words, check=False)
        outputs[command] = result.stdout + result.stderr
        assert result.returncode == 0, f"README: `{command}` exited {result.returncode}\n{outputs[command][-3000:]}"
        if "--queue" in command:
            sweep = re.search(r"train\.lr=([\d.e,-]+)", command).group(1).split(",")
            for lr in sorted(sweep, key=float)[:2]:
                project.dvc("exp", "run", "-S", "experiment=debug", "-S", "data=local", "-S",
                            f"data.path={fixture_dir}", "-S", f"train.lr={lr}", "-S",
                            f"train.seed={','.join(SWEEP_SEEDS)}", "--queue")
        if "--run-all" in command:
            found = experiment_names(project)
            lrs = sorted(float(lr) for lr in sweep)
            # the preset's own seed: the sweep's runs
            seed = next((s for (lr, s) in found if lr == lrs[0] and str(s) not in SWEEP_SEEDS), None)
            assert seed is not None and all((lr, seed) in found for lr in lrs), f"an LR did not train: {found}"
            names = {2: [found[(lrs[0], seed)], found[(lrs[1], seed)]], 3: [found[(lr, seed)] for lr in lrs],
                     6: [found[(lr, s)] for lr in lrs[:2] for s in (seed, *map(int, SWEEP_SEEDS))]}

    assert "Running stage 'report'" in outputs["make repro"]
    header = next(line for line in outputs["dvc exp show"].splitlines() if "Experiment" in line)
    assert header.index("val_bpc") < header.index("vs_base") < header.index("train.lr"), "metrics first, then train.lr"
    diffed = next(out for command, out in outputs.items() if command.count("<") == 2 and "report diff" in command)
    assert "B - A" in diffed and "params that differ: train.lr" in diffed, diffed
    grouped = next(out for command, out in outputs.items() if command.count("<") == 6)
    assert "G1" in grouped and "group" in grouped, grouped
