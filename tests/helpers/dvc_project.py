"""A throwaway copy of the project in a temporary git repo, for running the real DVC pipeline in tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import REPO_ROOT
from minigpt.core.compose import compose_params
from minigpt.testing.dvc_queue import run_captured, run_queue

COPIED = ["dvc.yaml", "conf", "stages", "minigpt", ".dvc/config", ".dvcignore", ".gitignore"]


class DvcProject:
    def __init__(self, root: Path, overrides: list[str]):
        self.root = root
        for name in COPIED:
            src, dst = REPO_ROOT / name, root / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(src, dst)
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(root),
            "DVC_NO_ANALYTICS": "1",
            "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
            "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com",
        }
        self.compose(overrides)
        self.git("init", "-q")
        # DVC's experiment commits read the repository's config, not the GIT_* variables
        self.git("config", "user.name", "test")
        self.git("config", "user.email", "test@example.com")
        self.git("add", "-A")
        self.git("commit", "-q", "-m", "fixture project")

    @classmethod
    def attach(cls, root: Path, env: dict) -> "DvcProject":
        """An existing checkout (e.g. a git clone of a project), run with the same environment."""
        project = cls.__new__(cls)
        project.root, project.env = root, {**env, "PYTHONPATH": str(root)}
        return project

    def compose(self, overrides: list[str]) -> None:
        compose_params(self.root / "params.yaml", self.root / "conf", overrides)

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        runner = run_queue if "--run-all" in args else run_captured
        result = runner(list(args), self.root, self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
        return result

    def git(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("git", *args)

    def dvc(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "dvc", *args, check=check)

    @staticmethod
    def stages_run(output: str) -> list[str]:
        return re.findall(r"Running stage '([^']+)'", output)
