"""A process named uniquely: its pid and its start time, so that a pid reused by another program does not look
like the process that recorded it (the run lock's holder, a thread-share worker)."""

from __future__ import annotations

import os
from pathlib import Path


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, it names a
    process uniquely, so a pid reused by another program does not look like the holder. None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if os.name != "posix" or Path("/proc").is_dir():
            return None
        try:  # no /proc (macOS): the pid alone
            os.kill(pid, 0)
            return "unknown"
        except OSError:
            return None
    return stat.rsplit(")", 1)[1].split()[19]


def process_is(pid: int, start: str | None) -> bool:
    """Whether `pid` still runs and is the process that recorded `start` (its process_start then)."""
    now = process_start(pid)
    return now is not None and now in (start, "unknown")
