"""Which source files define a run, and their fingerprint.

A stage script's code is the script plus every minigpt module it imports, directly or through other minigpt
modules (its import closure, read from the source with `ast`, so imports inside functions count too). The
preflight report, the gate, checkpoints and auto-resume bind the run's code: the closure of the preflight and
train scripts. dvc.yaml lists the same files as deps (a test keeps the two equal).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from minigpt.core.io_utils import canonical_json_digest, sha256_file

PACKAGE = "minigpt"
# the checkout that holds stages/ and minigpt/ (the code actually imported, also in a copied project)
CODE_ROOT = Path(__file__).resolve().parents[2]
# the scripts whose code a training run executes: preflight proves it, train runs it
RUN_SCRIPTS = ("stages/preflight.py", "stages/train.py")


def _module_file(dotted: str, root: Path) -> Path | None:
    """minigpt.x.y -> root/minigpt/x/y.py (or its package __init__.py); None if it is not a minigpt module."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = root.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=4096)
def _import_names(source: str, filename: str) -> tuple[str, ...]:
    """The dotted names a source imports, at any depth. Cached by the source text itself: parsing is the costly part
    (a fingerprint parses every file of the closure, and a preflight takes several), and an edited file is a new key."""
    names: list[str] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from minigpt import x` imports minigpt and, when x is a module, minigpt.x
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return tuple(names)


def _imported_files(path: Path, root: Path) -> set[Path]:
    # importing minigpt.a.b runs minigpt/__init__.py and minigpt/a/__init__.py first; each prefix is looked up once
    prefixes: set[str] = set()
    for name in _import_names(path.read_text(encoding="utf-8"), str(path)):
        parts = name.split(".")
        if parts[0] == PACKAGE:
            prefixes.update(".".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return {module for module in (_module_file(prefix, root) for prefix in prefixes) if module is not None}


def import_closure(script: str | Path, root: Path | None = None) -> list[str]:
    """The script and every minigpt module it imports transitively, as sorted paths relative to root."""
    root = root or CODE_ROOT
    start = root / script
    seen: set[Path] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_imported_files(path, root) - seen)
    return sorted(str(p.relative_to(root)) for p in seen)


def run_code_files(root: Path | None = None) -> list[str]:
    """The files that define a training run: the import closure of the preflight and train scripts."""
    root = root or CODE_ROOT
    return sorted(set().union(*(import_closure(script, root) for script in RUN_SCRIPTS)))


def code_fingerprint(root: Path | None = None) -> dict:
    """{"digest": one hash of them all, "files": {path: SHA-256}} for the run's code."""
    root = root or CODE_ROOT
    files = {name: sha256_file(root / name) for name in run_code_files(root)}
    return {"digest": canonical_json_digest(files), "files": files}


def changed_files(then: dict | None, now: dict) -> list[str]:
    """The files whose content differs between two code fingerprints (added and removed files included)."""
    old = (then or {}).get("files") or {}
    new = now["files"]
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


def name_files(files: list[str], most: int = 8) -> str:
    """A list of changed files for a one-line message: the first `most`, then how many more."""
    shown = ", ".join(files[:most])
    return f"{shown} and {len(files) - most} more" if len(files) > most else shown
