"""Chain of custody: every stage from clean on writes a provenance record beside its outputs (the SHA-256 of what it
read, of the values it actually used, and of what it wrote), and checks each artifact it reads against the record
of the stage that made it before using it.

The graph is declared once here (CONSUMES: for each stage, each role it reads, the artifact and the stage that
makes it), independently of the stages' own code, so a stage that reads the wrong artifact for a role, or uses
other values than the artifact it names, disagrees with the declaration and with its producer's record. The whole
graph is verified by the report stage (minigpt.report.custody), which recomputes every used digest from the files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import atomic_write_json, read_json, sha256_file
from minigpt.core.paths import (
    BASELINES_REPORT,
    BEST_CHECKPOINT,
    CLEAN_DIR,
    DEBUG_REPORT,
    ENCODED_DIR,
    EVAL_BLOCKS,
    EVAL_REPORT,
    GENERATION_REPORT,
    LATEST_CHECKPOINT,
    RAW_DIR,
    REPORTS_DIR,
    SOFT_TARGETS_DIR,
    SPLIT_FILES,
    TOKENIZER_FILE,
    TRAIN_LOG,
    TRAIN_SUMMARY,
)

FORMAT = 1
RECORD_NAME = "provenance.json"
PROVENANCE_DIR = REPORTS_DIR / "provenance"
# where each stage's record lives: inside its output folder, or (stages that write single files) reports/provenance/
RECORDS = {
    "clean": CLEAN_DIR / RECORD_NAME,
    "encode": ENCODED_DIR / RECORD_NAME,
    "soft_targets": SOFT_TARGETS_DIR / RECORD_NAME,
    "baselines": BASELINES_REPORT.parent / RECORD_NAME,
    "train": PROVENANCE_DIR / "train.json",
    "evaluate": PROVENANCE_DIR / "evaluate.json",
    "generate": PROVENANCE_DIR / "generate.json",
}
# the record of the whole graph as the report stage verified it (the run page reads it)
GRAPH_RECORD = PROVENANCE_DIR / "graph.json"
# stages whose artifacts are checked by hash alone: fetch (its manifest holds the release's hashes), the tokenizer
# (bound everywhere by its fingerprint) and preflight (its report is the gate's own record of what it proved)
UNRECORDED = ("fetch", "tokenizer", "preflight")


@dataclass(frozen=True)
class Role:
    """One thing a stage reads: the artifact, the stage that makes it, and whether every run reads it."""
    artifact: Path
    producer: str
    required: bool = True


def _clean(split: str) -> Path:
    return CLEAN_DIR / f"{split}.txt"


def _encoded(split: str) -> Path:
    return ENCODED_DIR / f"{split}.npy"


SOFT_TARGETS_FILE = SOFT_TARGETS_DIR / "targets.npz"
NGRAM_PRIORS_FILE = SOFT_TARGETS_DIR / "priors.npz"  # the n-gram at val and test positions (model.ngram_expert)

# stage -> role -> what it must read. The report stage holds every record to this declaration.
CONSUMES: dict[str, dict[str, Role]] = {
    "clean": {f"raw {s}": Role(RAW_DIR / SPLIT_FILES[s], "fetch") for s in ("train", "val", "test")},
    "encode": {**{f"{s} text": Role(_clean(s), "clean") for s in ("train", "val", "test")},
               "tokenizer": Role(TOKENIZER_FILE, "tokenizer")},
    "soft_targets": {f"{s} ids": Role(_encoded(s), "encode", required=False) for s in ("train", "val", "test")},
    "baselines": {"fitted on": Role(_clean("train"), "clean"), "val": Role(_clean("val"), "clean"),
                  "test": Role(_clean("test"), "clean")},
    "train": {"train ids": Role(_encoded("train"), "encode"), "val ids": Role(_encoded("val"), "encode"),
              "tokenizer": Role(TOKENIZER_FILE, "tokenizer"),
              "soft targets": Role(SOFT_TARGETS_FILE, "soft_targets", required=False),
              "n-gram priors": Role(NGRAM_PRIORS_FILE, "soft_targets", required=False),
              "preflight report": Role(DEBUG_REPORT, "preflight", required=False)},
    "evaluate": {"checkpoint": Role(BEST_CHECKPOINT, "train"), "tokenizer": Role(TOKENIZER_FILE, "tokenizer"),
                 "val": Role(_encoded("val"), "encode"), "test": Role(_encoded("test"), "encode"),
                 "train slice": Role(_encoded("train"), "encode"),
                 "baselines": Role(BASELINES_REPORT, "baselines"),
                 "soft targets": Role(SOFT_TARGETS_FILE, "soft_targets", required=False),
                 "n-gram priors": Role(NGRAM_PRIORS_FILE, "soft_targets", required=False)},
    "generate": {"checkpoint": Role(BEST_CHECKPOINT, "train"), "tokenizer": Role(TOKENIZER_FILE, "tokenizer"),
                 # model.ngram_expert: the n-gram's settings, and the train it is counted on
                 "n-gram summary": Role(SOFT_TARGETS_DIR / "summary.json", "soft_targets", required=False),
                 "n-gram train ids": Role(_encoded("train"), "encode", required=False)},
    # the report stage writes no record of its own: it verifies the graph and reads these
    "report": {"preflight report": Role(DEBUG_REPORT, "preflight"), "train log": Role(TRAIN_LOG, "train"),
               "train summary": Role(TRAIN_SUMMARY, "train"), "evaluation": Role(EVAL_REPORT, "evaluate"),
               "eval blocks": Role(EVAL_BLOCKS, "evaluate"), "generation": Role(GENERATION_REPORT, "generate")},
}
TRAIN_OUTPUTS = (BEST_CHECKPOINT, LATEST_CHECKPOINT, TRAIN_LOG, TRAIN_SUMMARY)


class CustodyError(MinigptError):
    """An artifact is not the one the stage that made it recorded: the chain of custody is broken."""


def values_digest(values) -> str:
    """SHA-256 of a sequence of integers as little-endian int64: the same digest whatever dtype holds them."""
    array = np.ascontiguousarray(np.asarray(values, dtype="<i8"))
    return hashlib.sha256(array.tobytes()).hexdigest()


def load_record(root: Path, stage: str) -> dict:
    path = Path(root) / RECORDS[stage]
    fix = f"run `dvc repro {stage}` (artifacts written before provenance records existed must be rebuilt)"
    record = read_json(path, missing=f"no provenance record of stage '{stage}'", invalid="not valid JSON", fix=fix,
                       error=CustodyError)
    if not (isinstance(record, dict) and record.get("stage") == stage and isinstance(record.get("outputs"), dict)
            and isinstance(record.get("inputs"), dict)):
        raise CustodyError(f"{path}: not a provenance record of stage '{stage}'; {fix}.")
    return record


class Custody:
    """One stage's record, filled as it reads and writes. `take` checks an artifact against its producer's record
    before the stage uses it; `used` records the digest of the values the stage actually used from it."""

    def __init__(self, stage: str, root: Path = Path(".")):
        self.stage, self.root = stage, Path(root)
        self.inputs: dict[str, dict] = {}
        self.outputs: dict[str, str] = {}

    def take(self, role: str) -> Path:
        """The role's artifact (under root), verified against what its producer recorded, its hash kept."""
        declared = CONSUMES[self.stage][role]
        path = self.root / declared.artifact
        if not path.is_file():
            raise CustodyError(f"{path}: not found, so stage '{self.stage}' cannot read its {role}; "
                               f"run `dvc repro {declared.producer}`.")
        digest = sha256_file(path)
        if declared.producer not in UNRECORDED:
            made = load_record(self.root, declared.producer)["outputs"].get(str(declared.artifact))
            if made != digest:
                raise CustodyError(
                    f"{path}: stage '{self.stage}' was about to read its {role}, but the file is not the one stage "
                    f"'{declared.producer}' recorded writing (sha256 {_short(digest)}, recorded "
                    f"{_short(made)}): it changed after '{declared.producer}' ran. Run `dvc repro "
                    f"{declared.producer}` (or `dvc repro`) so that every stage reads what the one before it made.")
        self.inputs[role] = {"artifact": str(declared.artifact), "producer": declared.producer, "sha256": digest}
        return path

    def used(self, role: str, values, start: int = 0, **encoding) -> None:
        """The values the stage actually used for `role`: artifact[start:start + len(values)], as token IDs (or, with
        encoding={"kind": "characters", ...}, as character IDs of the text)."""
        entry = self.inputs[role]
        entry["used"] = {"start": int(start), "stop": int(start) + len(values), "sha256": values_digest(values),
                         **({"kind": "ids"} if not encoding else encoding)}

    def made(self, *paths: Path) -> None:
        for path in paths:
            self.outputs[str(path)] = sha256_file(self.root / path)

    def clear(self, *outputs: Path) -> None:
        """Remove the stage's record and its previous outputs before it runs again."""
        forget(self.root, self.stage)
        for path in outputs:
            (self.root / path).unlink(missing_ok=True)

    def write(self) -> dict:
        record = {"format": FORMAT, "stage": self.stage, "inputs": self.inputs, "outputs": self.outputs}
        atomic_write_json(self.root / RECORDS[self.stage], record)
        return record


def forget(root: Path, stage: str) -> None:
    """Remove a stage's record before it rewrites its outputs: a run that stops half-way leaves no record, so what it
    left is refused downstream instead of passing for the last complete run's."""
    (Path(root) / RECORDS[stage]).unlink(missing_ok=True)


def _short(digest: str | None) -> str:
    return "none" if not digest else digest[:12]
