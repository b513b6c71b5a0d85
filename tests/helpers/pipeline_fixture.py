"""Build the data artifacts (fetch -> encode, baselines) of a debug-scale project under a directory, via the real
stages."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO_ROOT
from minigpt.core.compose import compose_params
from minigpt.core.config import load_params

DATA_STAGES = ("fetch", "clean", "tokenizer", "encode", "soft_targets", "baselines")


def build_project(root: Path, source_dir: Path, overrides: list[str] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    compose_params(root / "params.yaml", REPO_ROOT / "conf",
                   ["experiment=debug", "data=local", f"data.path={source_dir}", *overrides])
    for stage in DATA_STAGES:
        run_stage(root, stage)
    return root


def run_stage(root: Path, name: str) -> None:
    """One stage script in the project (e.g. soft_targets after a recompose that changed soft_targets.*)."""
    subprocess.run([sys.executable, str(REPO_ROOT / "stages" / f"{name}.py")], cwd=root, check=True,
                   capture_output=True)


def load_stage(name: str):
    """A stage script as a module, to run in-process (`stage.stage_main(name, stage.run, [])`) with a bug planted."""
    spec = importlib.util.spec_from_file_location(f"stage_{name}", REPO_ROOT / "stages" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def copy_project(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def recompose(root: Path, source_dir: Path, overrides: list[str], conf: Path = REPO_ROOT / "conf"):
    compose_params(root / "params.yaml", conf,
                   ["experiment=debug", "data=local", f"data.path={source_dir}", *overrides])
    return load_params(root / "params.yaml")


def record_as_written(root: Path, stage: str, path: Path) -> None:
    """A stage's provenance record rewritten as if the stage had written `path` as it is now (a test that edits an
    artifact by hand to reach a check behind the chain of custody)."""
    import json

    from minigpt.core.io_utils import sha256_file
    from minigpt.core.provenance import RECORDS

    record_file = root / RECORDS[stage]
    record = json.loads(record_file.read_text())
    record["outputs"][str(path.relative_to(root))] = sha256_file(path)
    record_file.write_text(json.dumps(record))
