"""Running `dvc exp run --run-all -j N` from a script (tests, benchmarks/sweep_workers.py) without hanging on DVC.

A DVC queue worker whose monitor sends its shutdown while the worker still runs a task can miss that message: the
`--run-all` command returns once the queue is done, but the worker idles on, holding the command's stdout and
stderr open. A caller reading them through pipes then never sees their end. `run_queue` captures through files and
ends such leftover workers afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

WORKER_PIDS = Path(".dvc/tmp/exps/celery")  # dvc-exp-worker-N.pid, under the repository root


def run_captured(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """subprocess.run(..., capture_output=True, text=True), captured through files: the call returns when the
    command exits, whatever children it left holding its output."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out, \
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err:
        code = subprocess.run(args, cwd=cwd, env=env, stdout=out, stderr=err).returncode
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(args, code, out.read(), err.read())


def stop_leftover_workers(root: Path) -> list[int]:
    """Ends the repository's DVC queue workers still running (the pids DVC recorded); the pids it ended."""
    stopped = []
    for pid_file in (root / WORKER_PIDS).glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (ValueError, OSError):
            continue  # gone already, or not Linux
        if b"queue-worker" in command:
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    return stopped


def run_queue(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """A `dvc exp run --run-all …` command, captured through files, its leftover workers ended."""
    try:
        return run_captured(args, cwd, env)
    finally:
        stop_leftover_workers(cwd)
