"""Scripts running `dvc exp run --run-all` return when the command does, and end the DVC queue workers it left."""

import hashlib
import os
import signal
import subprocess
import sys
import time

from minigpt.testing.dvc_queue import WORKER_PIDS, run_captured, stop_leftover_workers

SLEEPER = "import time; time.sleep(60)"


def test_the_capture_ends_with_the_command_not_with_a_child_that_keeps_its_output_open(tmp_path):
    started = time.monotonic()
    result = run_captured(["sh", "-c", f"{sys.executable} -c '{SLEEPER}' & echo $!; echo done >&2"], tmp_path, {})
    child = int(result.stdout.split()[0])
    try:
        assert result.returncode == 0 and result.stderr == "done\n"
        assert time.monotonic() - started < 30, "waited for the child still holding stdout"
    finally:
        os.kill(child, signal.SIGTERM)


def test_leftover_queue_workers_are_ended_and_other_processes_left_alone(tmp_path):
    folder = tmp_path / WORKER_PIDS
    folder.mkdir(parents=True)
    # DVC names worker N of a repository dvc-exp-<sha256 of its .dvc/tmp/exps/celery path>[:6]-N@localhost
    node = f"dvc-exp-{hashlib.sha256(str(folder).encode()).hexdigest()[:6]}-1@localhost"
    worker = subprocess.Popen([sys.executable, "-c", SLEEPER, "exp", "queue-worker", node])
    elsewhere = subprocess.Popen([sys.executable, "-c", SLEEPER, "exp", "queue-worker", "dvc-exp-0a1b2c-2@localhost"])
    other = subprocess.Popen([sys.executable, "-c", SLEEPER])
    try:
        (folder / "dvc-exp-worker-1.pid").write_text(f"{worker.pid}\n")
        (folder / "dvc-exp-worker-2.pid").write_text(f"{elsewhere.pid}\n")  # another repository's worker took it
        (folder / "dvc-exp-worker-3.pid").write_text(f"{other.pid}\n")  # a pid reused by another program
        (folder / "dvc-exp-worker-4.pid").write_text("999999999\n")  # a worker gone already
        started = time.monotonic()
        assert stop_leftover_workers(tmp_path) == [worker.pid]
        assert time.monotonic() - started < 5, "an ended worker its parent has not reaped yet counts as ended"
        assert worker.wait(timeout=10) != 0 and elsewhere.poll() is None and other.poll() is None
    finally:
        for process in (worker, elsewhere, other):
            process.kill()
            process.wait()
