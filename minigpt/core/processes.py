"""A process named uniquely: its pid and its start time, so that a pid reused by another program does not look
like the process that recorded it (the run lock's holder, a thread-share worker)."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (which may hold spaces and parentheses); None if unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_running(pid: int) -> bool:
    """Whether the process runs (one that exited and its parent has not reaped yet does not); False without /proc."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid, it names a
    process uniquely, so a pid reused by another program does not look like the holder. None if it is gone."""
    fields = _stat_fields(pid)
    if fields is None:
        if os.name != "posix" or Path("/proc").is_dir():
            return None
        try:  # no /proc (macOS): the pid alone
            os.kill(pid, 0)
            return "unknown"
        except OSError:
            return None
    return fields[19]


def process_is(pid: int, start: str | None) -> bool:
    """Whether `pid` still runs and is the process that recorded `start` (its process_start then)."""
    now = process_start(pid)
    return now is not None and now in (start, "unknown")
