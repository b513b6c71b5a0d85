"""Atomic writes and hashing: an artifact is either complete or absent, never half-written."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from minigpt.core.errors import WriteFailed

_CHUNK = 1 << 20


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# what a full disk, a quota or a folder that turned read-only raise while an output is written
WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}


@contextmanager
def named_write_failures(target: Path) -> Iterator[None]:
    """A write the machine refuses inside the block becomes one message naming the output (not the temp file)
    and the cause; any other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno in WRITE_FAILURES:
            raise WriteFailed(target, exc.strerror or str(exc)) from None
        raise


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path in the target's folder; on success fsync it and os.replace it onto `path`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with named_write_failures(target):
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with named_write_failures(target):
            yield tmp
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the usual permissions
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def remove_stale_temp_files(folder: str | os.PathLike, target_glob: str = "*") -> list[Path]:
    """Delete atomic_path's temp files (.<target>.<random>.tmp) for targets matching target_glob, left by a write
    killed half-way. Call it only where no other writer can be mid-write (e.g. under a run lock)."""
    folder = Path(folder)
    stale = sorted(folder.glob(f".{target_glob}.*.tmp")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Build a directory in a temp sibling; replace `path` with it only if the block succeeds."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with named_write_failures(target):
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        with named_write_failures(target):
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp creates 0700
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def read_json(path: str | os.PathLike, *, missing: str, invalid: str, fix: str, error: type[Exception]) -> Any:
    """Parse a JSON artifact; a missing or unreadable file raises `error` naming the file and the fix."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: {missing}; {fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{path}: {invalid} ({exc}); {fix}") from None


def canonical_json_digest(obj: Any) -> str:
    """SHA-256 of a JSON value with sorted keys and no whitespace: a stable fingerprint of a config."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return sha256_bytes(text.encode("utf-8"))
