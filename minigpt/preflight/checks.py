"""The check framework: named checks run in order, each passing with what it measured or failing with the
measurement, the threshold and the likely causes; checks whose prerequisites did not pass are skipped.

Any exception a check meets is a failure of that check (its type, message and where it was raised), never a
crash of the whole run, so a report is always written.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # the framework runs any checks on any context; preflight's is minigpt.preflight.context
    from minigpt.preflight.context import Context
else:
    Context = Any


class CheckFailed(Exception):
    def __init__(self, message: str, measured: dict | None = None):
        super().__init__(message)
        self.measured = measured or {}


@dataclass
class CheckResult:
    name: str
    status: str  # passed | failed | skipped
    measured: dict
    threshold: str
    seconds: float
    message: str = ""
    likely_causes: list[str] = field(default_factory=list)
    family: str = ""

    def to_dict(self) -> dict:
        out = {
            "name": self.name,
            "family": self.family,
            "status": self.status,
            "passed": self.status == "passed",
            "measured": self.measured,
            "threshold": self.threshold,
            "seconds": round(self.seconds, 4),
        }
        if self.status != "passed":
            out["message"] = self.message
        if self.status == "failed":
            out["likely_causes"] = self.likely_causes
        return out


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Context], dict]
    needs: tuple[str, ...]
    threshold: str | Callable[[Context], str]
    likely_causes: tuple[str, ...]
    # the debugging guide's failure family: correctness, numerical or optimisation
    family: str = ""

    def threshold_text(self, ctx: Context) -> str:
        return self.threshold(ctx) if callable(self.threshold) else self.threshold


def describe_exception(exc: BaseException) -> str:
    """'TypeError: message (raised in minigpt/preflight/model_checks.py:123, check_x)': where it was raised, innermost
    frame first of the project's own code (model, checks, training step) rather than torch's internals."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if "site-packages" not in f.filename and "/torch/" not in f.filename]
    frame = (own or frames or [None])[-1]
    where = ""
    if frame is not None:
        where = f" (raised in {Path(frame.filename).name}:{frame.lineno}, {frame.name}: {(frame.line or '').strip()!r})"
    return f"{type(exc).__name__}: {exc}{where}"


def run_checks(ctx: Context, checks: tuple[Check, ...], only: set[str] | None = None) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}
    for check in checks:
        if only is not None and check.name not in only:
            continue
        blocked = [n for n in check.needs if n in results and results[n].status != "passed"]
        blocked += [n for n in check.needs if n not in results and (only is None or n in only)]
        start = time.perf_counter()
        if blocked:
            reason = ", ".join(f"{n} {results[n].status if n in results else 'not run'}" for n in blocked)
            result = CheckResult(check.name, "skipped", {}, _safe_threshold(check, ctx), 0.0,
                                 f"skipped: needs {reason}")
        else:
            try:
                measured = check.run(ctx)
                result = CheckResult(check.name, "passed", measured, _safe_threshold(check, ctx),
                                     time.perf_counter() - start)
            except CheckFailed as exc:
                result = CheckResult(check.name, "failed", exc.measured, _safe_threshold(check, ctx),
                                     time.perf_counter() - start, str(exc), list(check.likely_causes))
            except Exception as exc:  # whatever a check meets is that check's failure, not a crash
                message = f"the check raised {describe_exception(exc)}"
                result = CheckResult(check.name, "failed", {"exception": type(exc).__name__},
                                     _safe_threshold(check, ctx), time.perf_counter() - start, message,
                                     ["a bug in the code this check exercises (see the exception)",
                                      *check.likely_causes])
        result.family = check.family
        results[check.name] = result
    return list(results.values())


def _safe_threshold(check: Check, ctx: Context) -> str:
    try:
        return check.threshold_text(ctx)
    except Exception:  # a threshold that needs an artifact that failed to load
        return "(needs an earlier check)"


def describe_time(seconds: dict, budget_seconds: float | None = None) -> str:
    """Where a report's preflight time went, in one line (a field an old report lacks reads "?"); with a time budget
    (train.max_seconds), the whole preflight's share of it."""
    def fmt(key: str) -> str:
        value = seconds.get(key)
        return f"{value:.2f} s" if isinstance(value, (int, float)) else "?"

    line = f"checks {fmt('total')} ({fmt('without_overfit')} without the overfit check); preflight {fmt('preflight')}"
    whole = seconds.get("preflight")
    if budget_seconds and isinstance(whole, (int, float)):
        line += f" = {100 * whole / budget_seconds:.1f}% of train.max_seconds ({budget_seconds:g} s)"
    return line


def format_table(checks: list[dict]) -> str:
    """The console summary of a report's checks (CheckResult.to_dict() rows)."""
    rows = [f"{'check':<22} {'status':<8} {'seconds':>8}  detail"]
    for c in checks:
        rows.append(f"{c['name']:<22} {c['status'].upper():<8} {c['seconds']:>8.3f}  {c.get('message', '')}")
        if c["status"] == "failed":
            rows.append(f"{'':<22} threshold: {c['threshold']}")
            rows.extend(f"{'':<22} likely cause: {cause}" for cause in c.get("likely_causes", []))
    return "\n".join(rows)
