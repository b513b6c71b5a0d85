"""The run's step log (reports/train_log.jsonl, the guide's artifact) and the curves drawn from it.

One JSON line per step, flushed as it is written, so a crash leaves a readable file. The log is the run's only
copy of its history: a checkpoint records how many steps the log held when it was saved and a digest of those
lines, and a resumed run keeps exactly those lines (a log that does not match is restarted, and said).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from minigpt.core.io_utils import atomic_write_text
from minigpt.core.paths import CURVES_PNG, TRAIN_PLOT_CSV, VAL_PLOT_CSV


def _line(record: dict) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def digest_of(records: list[dict]) -> str:
    digest = hashlib.sha256()
    for record in records:
        digest.update(_line(record))
    return digest.hexdigest()


def parse_log(text: str) -> list[dict]:
    """The step records of a log's text; a last line cut short by a kill is dropped."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def read_log(path: Path) -> list[dict]:
    return parse_log(path.read_text(encoding="utf-8")) if path.is_file() else []


def history_for_resume(path: Path, step: int, expected_digest: str | None) -> list[dict] | None:
    """The log's records up to `step` when they are the ones the checkpoint saw (None otherwise)."""
    kept = [r for r in read_log(path) if r.get("step", 0) <= step]
    if len(kept) != step or expected_digest is None or digest_of(kept) != expected_digest:
        return None
    return kept


class RunLog:
    """Writes the log from `history` on (a resumed run rewrites the lines it keeps), one flushed line per step."""

    def __init__(self, path: Path, history: list[dict]):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(path, "wb")
        self.digest = hashlib.sha256()
        self.steps = 0
        for record in history:
            self.write(record)

    def write(self, record: dict) -> None:
        line = _line(record)
        self.handle.write(line)
        self.handle.flush()
        self.digest.update(line)
        self.steps += 1

    def mark(self) -> dict:
        """What a checkpoint saved now records of the log: its length and digest (the lines are on disk first)."""
        os.fsync(self.handle.fileno())
        return {"log_steps": self.steps, "log_sha256": self.digest.hexdigest()}

    def close(self) -> None:
        self.handle.close()


def write_curves(history: list[dict], root: Path, png: bool = True) -> None:
    """CSV plots for `dvc plots` (JSONL is not accepted there) and, with png, a PNG readable offline."""
    rows = ["step,train_loss,lr,grad_norm"]
    rows += [f"{r['step']},{r['train_loss']},{r['lr']},{r['grad_norm']}" for r in history]
    atomic_write_text(root / TRAIN_PLOT_CSV, "\n".join(rows) + "\n")
    val = [r for r in history if "val_loss" in r]
    atomic_write_text(root / VAL_PLOT_CSV,
                      "\n".join(["step,val_loss"] + [f"{r['step']},{r['val_loss']}" for r in val]) + "\n")
    if not png:
        return
    from minigpt.core.charts import Series, save_png  # matplotlib: imported only where a PNG is drawn

    steps = [r["step"] for r in history]
    save_png(root / CURVES_PNG, [
        ("loss", [Series("train", list(zip(steps, (r["train_loss"] for r in history)))),
                  Series("val", [(r["step"], r["val_loss"]) for r in val], markers=True)], "step", "loss (nats/char)"),
        ("learning rate", [Series("lr", list(zip(steps, (r["lr"] for r in history))))], "step", "learning rate")])
