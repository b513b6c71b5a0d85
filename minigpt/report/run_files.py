"""What one run left behind, read from the workspace or from any git/DVC revision (an experiment too).

Every file is optional: a run refused by the gate has a preflight report and nothing after it, and the pages
show what there is. Files are read through DVC's own API (`dvc.api.read`) for revisions, so an experiment's
files come from its commit whether git or the DVC cache holds them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from minigpt.core.config import DEFAULT_PARAMS
from minigpt.core.paths import (
    DEBUG_REPORT,
    EVAL_BLOCKS,
    EVAL_REPORT,
    GENERATION_REPORT,
    TRAIN_LOG,
    TRAIN_SUMMARY,
)
from minigpt.core.provenance import GRAPH_RECORD
from minigpt.train.run_log import parse_log

PARAMS_FILE = DEFAULT_PARAMS
WORKSPACE = "workspace"  # the run in the project folder itself (not a revision)


@dataclass
class RunFiles:
    name: str
    params: dict | None = None
    preflight: dict | None = None
    train_log: list[dict] = field(default_factory=list)
    train: dict | None = None
    evaluation: dict | None = None
    generation: dict | None = None
    eval_blocks: dict | None = None  # per split, the summed NLL of blocks of the scored targets
    custody: dict | None = None  # the chain of custody as the report stage verified it (minigpt.report.custody)
    state: str = ""  # DVC's experiment state (Success, Failed, …) when the run is an experiment

    @property
    def preflight_passed(self) -> bool | None:
        return None if self.preflight is None else bool(self.preflight.get("passed"))

    @property
    def watchdog_events(self) -> list[dict]:
        """Every watchdog firing in the run log, with its step (a stopped run has no summary, but has these)."""
        return [{"step": record.get("step"), **event} for record in self.train_log for event in record.get("watch", [])]

    @property
    def failed_checks(self) -> list[dict]:
        return [c for c in (self.preflight or {}).get("checks", []) if c.get("status") == "failed"]


def ngram_weight(mixture: dict) -> float:
    """The n-gram's share of the model + n-gram mixture: evaluation.json stores the model's weight, pages show this."""
    return 1 - mixture["weight"]


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in (tree or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def flat_params(run: RunFiles) -> dict:
    """The run's params as dotted keys ("train.lr": 0.003), as `dvc exp show` and `-S` name them."""
    return _flatten(run.params or {})


def _parse_json(text: str):
    return json.loads(text)


def load_run(name: str, read: Callable[[str], str | None], state: str = "") -> RunFiles:
    """The run's files through `read(path) -> text or None`."""
    run = RunFiles(name=name, state=state)
    sources = (("params", PARAMS_FILE, yaml.safe_load), ("preflight", DEBUG_REPORT, _parse_json),
               ("train_log", TRAIN_LOG, parse_log), ("train", TRAIN_SUMMARY, _parse_json),
               ("evaluation", EVAL_REPORT, _parse_json), ("generation", GENERATION_REPORT, _parse_json),
               ("eval_blocks", EVAL_BLOCKS, _parse_json), ("custody", GRAPH_RECORD, _parse_json))
    for attribute, path, parse in sources:
        text = read(str(path))
        if text is None:
            continue
        try:
            setattr(run, attribute, parse(text))
        except (ValueError, yaml.YAMLError):
            pass  # a file that does not parse is shown as missing
    return run


def workspace_reader(root: Path) -> Callable[[str], str | None]:
    def read(path: str) -> str | None:
        file = Path(root) / path
        return file.read_text(encoding="utf-8") if file.is_file() else None
    return read


def revision_reader(root: Path, rev: str) -> Callable[[str], str | None]:
    """Files of `rev` (a commit, branch, tag or experiment) through dvc.api."""
    import dvc.api
    from dvc.exceptions import DvcException

    def read(path: str) -> str | None:
        try:
            return dvc.api.read(path, repo=str(root), rev=rev, encoding="utf-8")
        except (FileNotFoundError, DvcException):
            return None
    return read
