"""Running `dvc exp run --run-all -j N` from a script (tests, benchmarks/sweep_workers.py) without hanging on DVC.

A DVC queue worker whose monitor sends its shutdown while the worker still runs a task can miss that message: the
`--run-all` command returns once the queue is done, but the worker idles on, and the process DVC forked to wait for
it keeps the command's stdout and stderr open. A caller reading them through pipes then never sees their end.
`run_queue` captures through files and ends such leftover workers afterwards."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from minigpt.core.processes import process_running

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


def worker_node_names(root: Path, number: str) -> set[bytes]:
    """The node name DVC gives this repository's queue worker N: dvc-exp-<sha256 of its celery folder>[:6]-N@localhost
    (the folder as written, and resolved, since DVC may have been given either)."""
    folder = root / WORKER_PIDS
    return {f"dvc-exp-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}-{number}@localhost".encode()
            for path in (folder, folder.resolve())}


def stop_leftover_workers(root: Path, wait_s: float = 10.0) -> list[int]:
    """Ends the repository's DVC queue workers still running, named by the pid files DVC leaves (a pid now held by
    any other process, another repository's worker included, is left alone); waits up to wait_s for them to exit, so
    that the folder can be removed. The pids it ended."""
    stopped = []
    for pid_file in (root / WORKER_PIDS).glob("dvc-exp-worker-*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (ValueError, OSError):
            continue  # gone already, or not Linux
        if b"queue-worker" in command and worker_node_names(root, pid_file.stem.rsplit("-", 1)[1]) & set(command):
            os.kill(pid, signal.SIGTERM)
            stopped.append(pid)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(process_running(pid) for pid in stopped):
        time.sleep(0.1)
    return stopped


def run_queue(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    """A `dvc exp run --run-all …` command, captured through files, its leftover workers ended."""
    try:
        return run_captured(args, cwd, env)
    finally:
        stop_leftover_workers(cwd)
