"""Each minigpt process's share of the CPU cores: cores / the minigpt processes running on this machine.

Two processes that each use every core slow each other several-fold (OpenMP threads spin waiting for each
other), which is what `dvc exp run --run-all -j 2`, torchrun on one machine, or two stages at once do by default.
Every stage registers its process in a per-user folder while it runs; torch gets max(1, cores // live processes)
threads, recomputed when the training loop asks (`rebalance`), so a process that started alone gives cores back
when a second one starts, and takes them again when it ends.

Overrides: MINIGPT_THREADS=N fixes this process's threads; OMP_NUM_THREADS (when set) is respected as is.

torch is not imported here: a stage that computes imports it with its own modules before its run starts, and one
that never does (report) does not pay torch's import (about 2 s) for a thread count it would not use.
"""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from minigpt.core.errors import ConfigError
from minigpt.core.processes import process_is, process_start

THREADS_ENV = "MINIGPT_THREADS"
REGISTRY_ENV = "MINIGPT_WORKER_DIR"

_active: "ThreadShare | None" = None
_held = False  # inside held(): rebalance() keeps the thread count


def registry() -> Path:
    default = Path(tempfile.gettempdir()) / f"minigpt-workers-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    return Path(os.environ.get(REGISTRY_ENV, default))


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def live_workers(folder: Path) -> int:
    """minigpt processes registered and still running (entries of dead processes are removed)."""
    count = 0
    for entry in folder.glob("*.pid"):
        try:
            pid, recorded = int(entry.stem), entry.read_text().strip()
        except (ValueError, OSError):
            continue
        # the pid and its start time: a pid reused by another program after a kill does not count
        if process_is(pid, recorded):
            count += 1
        else:
            entry.unlink(missing_ok=True)
    return max(1, count)


def _torch():
    """torch when this process has imported it, else None (then there are no torch threads to set)."""
    return sys.modules.get("torch")


def _fixed_threads(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{THREADS_ENV}={value!r}: must be a whole number of threads >= 1 (unset it to share the "
                          "cores among the minigpt processes running on this machine).")
    return int(value)


class ThreadShare:
    """Registers this process for its lifetime and sets torch's threads to its share of the cores."""

    def __init__(self, folder: Path | None = None):
        self.folder = folder or registry()
        self.entry = self.folder / f"{os.getpid()}.pid"
        self.fixed = _fixed_threads(os.environ.get(THREADS_ENV))
        self.respect_omp = THREADS_ENV not in os.environ and "OMP_NUM_THREADS" in os.environ
        self.threads: int | None = None  # torch's thread count, once torch is imported

    def __enter__(self) -> "ThreadShare":
        global _active
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.entry.write_text(process_start(os.getpid()) or "")
        except OSError:
            pass  # no shared folder: the share is computed as if alone
        _active = self
        self.apply()
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None
        self.entry.unlink(missing_ok=True)

    def share(self) -> int:
        if self.fixed:
            return self.fixed
        return max(1, available_cores() // live_workers(self.folder))

    def apply(self) -> int:
        torch = _torch()
        if torch is None:
            return self.share()
        if self.threads is None:
            self.threads = torch.get_num_threads()
        if self.respect_omp:
            return self.threads
        wanted = self.share()
        if wanted != self.threads:
            torch.set_num_threads(wanted)
            self.threads = wanted
        return wanted


@contextmanager
def held():
    """Inside the block rebalance() leaves torch's thread count as it is, whatever other minigpt processes start or
    end: a float reduction's result depends on how many threads split it, so runs compared bit for bit must share
    one count."""
    global _held
    outer, _held = _held, True
    try:
        yield
    finally:
        _held = outer


def rebalance() -> int:
    """Recompute this process's share (the training loop calls it between steps; inside held() it changes nothing);
    the thread count in use."""
    if _active is not None and not _held:
        return _active.apply()
    import torch  # the training loop's caller has it loaded already

    return torch.get_num_threads()
