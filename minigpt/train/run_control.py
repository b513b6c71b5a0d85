"""Who may train in a folder, and how a run stops: one trainer per models/ (a lock file), and a clean stop on
Ctrl-C, SIGTERM or the death of the parent process (finish the step, checkpoint it, say how to resume)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

from minigpt.core.errors import MinigptError
from minigpt.core.processes import process_is, process_start

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class RunLocked(MinigptError):
    """Another live trainer holds this run's lock."""


class RunLock:
    """models/.train.lock holds the trainer's pid, start time and host; taken before any write, released on exit.

    A lock whose process is gone (or whose pid now belongs to another process) is stale and taken over."""

    def __init__(self, path: Path, out=print):
        self.path = path
        self.out = out
        self.mine = {"pid": os.getpid(), "start": process_start(os.getpid()), "host": socket.gethostname(),
                     "started_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        self.held = False

    def _holder(self) -> dict | None:
        try:
            holder = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _alive(self, holder: dict) -> bool:
        if holder.get("host") != self.mine["host"]:
            return True  # another machine's process cannot be checked from here: assume it runs
        return process_is(int(holder.get("pid", -1)), holder.get("start"))

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is not None and self._alive(holder):
                    raise RunLocked(
                        f"{self.path}: another trainer is running on this folder (pid {holder.get('pid')} on "
                        f"{holder.get('host')}, started {holder.get('started_at')}). Wait for it to finish or stop it "
                        f"(kill {holder.get('pid')}); two trainers would overwrite each other's checkpoints and log."
                    ) from None
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as handle:
                json.dump(self.mine, handle)
            self.held = True
            return
        raise RunLocked(f"{self.path}: could not take the run lock (it keeps reappearing); is another trainer "
                        "starting?")

    def release(self) -> None:
        """Remove the lock if it is still ours. A folder that turned read-only (a full quota, `chattr +i`) keeps
        it: said in one line, never raised, so the failure that ended the run stays the message a person sees."""
        try:
            if self.held and self._holder() == self.mine:
                self.path.unlink(missing_ok=True)
        except OSError as exc:
            self.out(f"[train] could not remove the run lock {self.path} ({exc.strerror or exc}); it names this "
                     "process, so once the folder is writable again the next trainer takes it over by itself.")
        self.held = False

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class StopRequest:
    """Turns the first SIGINT/SIGTERM into a request the loop honours after the current step; a second one
    interrupts at once. A changed parent pid (the parent died; the process was re-parented) counts as SIGTERM."""

    def __init__(self, at_step: int | None = None):
        self.signum: int | None = None
        self.reason = ""
        self.at_step = at_step  # a stop asked for in advance, after that step (no signal)
        self._parent = os.getppid()
        self._previous: dict[int, object] = {}

    def _handle(self, signum, _frame) -> None:
        if self.signum is not None:  # a second Ctrl-C: stop now
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
            raise KeyboardInterrupt
        self.signum, self.reason = signum, signal.Signals(signum).name

    def __enter__(self) -> "StopRequest":
        try:
            for signum in EXIT_CODES:
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._previous.clear()
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @property
    def requested(self) -> bool:
        if self.signum is None and os.getppid() != self._parent:
            self.signum, self.reason = signal.SIGTERM, f"parent process {self._parent} exited"
        return self.signum is not None

    def requested_after(self, step: int) -> bool:
        if self.at_step is not None and step >= self.at_step and self.signum is None:
            self.reason = f"asked to stop after step {self.at_step}"
            return True
        return self.requested

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 143)


class TrainingStopped(MinigptError):
    """The run stopped on request after checkpointing its last step."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
