"""Real filesystem faults for the tests: a small tmpfs mounted over a project folder (a disk that fills up) and
`chattr +i` (a folder that turns read-only). Both need root; where the machine refuses, the test is skipped with
the reason."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, spare_bytes: int):
    """`folder` on a tmpfs of its current size plus `spare_bytes`, its files copied in; unmounted afterwards (the
    mount hid the folder's own files, so they come back as they were)."""
    folder.mkdir(parents=True, exist_ok=True)
    used = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    kept = Path(tempfile.mkdtemp(prefix="kept-", dir=folder.parent))
    shutil.copytree(folder, kept, dirs_exist_ok=True)
    size_kb = (used + spare_bytes) // 1024 + 64  # tmpfs rounds to pages; directories take some room too
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode:
        shutil.rmtree(kept)
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); the test needs root")
    try:
        shutil.copytree(kept, folder, dirs_exist_ok=True)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        shutil.rmtree(kept)


def fill(folder: Path) -> None:
    """Write a filler file in `folder` until its filesystem has no space left."""
    with open(folder / "filler.bin", "wb", buffering=0) as handle:
        for chunk in (65536, 4096, 1):  # down to the last byte
            try:
                while handle.write(b"\0" * chunk):
                    pass
            except OSError:
                continue
