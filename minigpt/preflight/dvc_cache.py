"""Whether a file was checked out from a damaged DVC cache copy.

DVC trusts its cache: `dvc checkout` and a queued experiment's workspace copy an output from the object named by
the output's MD5 without reading it again, and `dvc repro --force` does not replace an object that exists. An
object whose bytes changed under .dvc/cache (a disk fault, a hand edit, a tool that wrote through a link) is
therefore handed to every later run. Preflight notices the file (its SHA-256 differs from what encode recorded);
this module says whether the cache copy is why, and which object to delete."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _recorded_md5(lock: dict, relative: str, object_path) -> str | None:
    """The MD5 dvc.lock records for the file: its own output's, or its entry in its folder output's manifest."""
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            path, md5 = out.get("path"), str(out.get("md5") or "")
            if relative == path:
                return md5
            if relative.startswith(f"{path}/") and md5.endswith(".dir"):
                manifest = json.loads(Path(object_path(md5)).read_text(encoding="utf-8"))
                inside = relative[len(path) + 1:]
                return next((entry.get("md5") for entry in manifest if entry.get("relpath") == inside), None)
    return None


def damaged_cache_copy(root: Path, file: Path) -> Path | None:
    """The cache object `file` comes from, when its bytes no longer have the MD5 it is stored under; None when
    there is no DVC project or record of the file, or the object is sound."""
    try:
        from dvc.repo import Repo

        lock = yaml.safe_load((root / "dvc.lock").read_text(encoding="utf-8")) or {}
        with Repo(str(root)) as repo:
            object_path = repo.cache.local.oid_to_path
            recorded = _recorded_md5(lock, file.relative_to(root).as_posix(), object_path)
            if not recorded:
                return None
            cached = Path(object_path(recorded))
            return cached if cached.is_file() and _md5(cached) != recorded else None
    except Exception:  # not a DVC project, no lock, an unreadable manifest: nothing to say about the cache
        return None
