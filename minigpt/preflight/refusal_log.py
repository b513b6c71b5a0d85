"""A refused preflight's report for the comparison page, in one log line.

A queued experiment runs in a throwaway copy of the project (under .dvc/tmp/exps) and, when preflight refuses it,
keeps only its log (`dvc queue logs`): there the stage prints its report in one compact line that the comparison
page reads back. A run in the project itself (`dvc repro`, `dvc exp run`) keeps reports/debug_report.json, so it
prints only the table and the error line.
"""

from __future__ import annotations

import json
from pathlib import Path

PREFIX = "[preflight] refused report, for the comparison page: "
OLD_PREFIX = "[preflight] report: "  # the full JSON line earlier versions logged
DETAIL_FIELDS = ("threshold", "message", "likely_causes")


def in_throwaway_copy(cwd: Path | None = None) -> bool:
    """Whether this process runs in a copy of the project that DVC deletes afterwards (a queued experiment)."""
    return "/.dvc/tmp/exps/" in f"{(cwd or Path.cwd()).resolve().as_posix()}/"


def report_log_line(report: dict) -> str:
    """Every check's status, and the detail of those that did not pass."""
    checks = report.get("checks", [])
    compact = {"failed": report.get("failed", []), "status": {c["name"]: c["status"] for c in checks},
               "detail": {c["name"]: {k: c[k] for k in DETAIL_FIELDS if k in c}
                          for c in checks if c["status"] != "passed"}}
    return PREFIX + json.dumps(compact, ensure_ascii=False, separators=(",", ":"))


def report_from_log(text: str) -> dict | None:
    """The report a refused run logged (the last one in the text, this format or the earlier full one), or None."""
    lines = [line for line in text.splitlines() if line.startswith((PREFIX, OLD_PREFIX))]
    if not lines:
        return None
    line = lines[-1]
    try:
        if line.startswith(OLD_PREFIX):
            return json.loads(line[len(OLD_PREFIX):])
        compact = json.loads(line[len(PREFIX):])
        checks = [{"name": name, "status": status, **compact["detail"].get(name, {})}
                  for name, status in compact["status"].items()]
        return {"passed": False, "failed": compact["failed"], "checks": checks}
    except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
        return None
