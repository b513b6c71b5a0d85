"""The watchdog false-alarm benchmark's rows (one per run: preset, seed, machine, what fired, val/test bpc) and their
summary per preset, written after every run so that long presets run in slices (benchmarks/watchdog_false_alarms.py
--append)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from minigpt.core.io_utils import atomic_write_text
from minigpt.evaluate.intervals import welch_interval


def tokens_stale(params, built: dict) -> bool:
    """Whether the scratch project's tokenizer, encoded splits and soft targets must be rebuilt for this run's params
    (its tokenizer or soft-target settings differ from those they were last built for; recorded in `built`)."""
    wanted = {name: params.section_dict(name) for name in ("tokenizer", "soft_targets")}
    if built.get("for") == wanted:
        return False
    built["for"] = wanted
    return True


def spread(values: list[float]) -> dict | None:
    """Mean, sample sd and the 95% t-interval of the mean over seeds (None under two values: no spread)."""
    if len(values) < 2:
        return None
    mean, sd = statistics.mean(values), statistics.stdev(values)
    interval = welch_interval(mean, [(sd ** 2 / len(values), len(values) - 1)])["ci95"]
    return {"mean": mean, "sd": sd, "mean_ci95": interval}


def summarise(rows: list[dict]) -> dict:
    """Per preset: runs, refusals, stops, warnings, the val bpc range and spread (and test's) over the trained
    runs, and the machines the rows ran on."""
    summary = {}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        mine = [r for r in rows if r["preset"] == preset]
        trained = [r for r in mine if "val_bpc" in r]
        summary[preset] = {"runs": len(mine), "seeds": [r["seed"] for r in mine],
                           "machines": sorted({r["machine"] for r in mine}),
                           "refused": sum(not r["preflight_passed"] for r in mine),
                           "stopped": sum("stopped" in r for r in mine),
                           "runtime_checks_failed": sum("check_failed" in r for r in mine),
                           "runs_with_warnings": sum(r["warnings"] > 0 for r in trained),
                           "warnings": sum(r["warnings"] for r in trained),
                           "val_bpc": [min((r["val_bpc"] for r in trained), default=None),
                                       max((r["val_bpc"] for r in trained), default=None)],
                           "vs_best_static_bpc": [min((r["vs_best_static_bpc"] for r in trained), default=None),
                                                  max((r["vs_best_static_bpc"] for r in trained), default=None)],
                           "val_bpc_spread": spread([r["val_bpc"] for r in trained]),
                           "test_bpc_spread": spread([r["test_bpc"] for r in trained])}
    return summary


def earlier_rows(out: Path) -> list[dict]:
    """The rows an earlier slice wrote to out (none if it does not exist yet)."""
    return json.loads(out.read_text())["rows"] if out.exists() else []


def write_results(out: Path, label: dict, smoke: bool, rows: list[dict], manifest: dict | None = None) -> None:
    """The rows so far and their summary, with the benchmark's manifest first (where the file came from)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    head = {"manifest": manifest} if manifest else {}
    atomic_write_text(out, json.dumps({**head, "machine": label, "smoke": smoke, "summary": summarise(rows),
                                       "rows": rows}, indent=2) + "\n")
