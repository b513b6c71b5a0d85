"""The checks train, evaluate and generate record about themselves (the guide's "during training" and "during
generation" checklists, evaluation in evaluation mode), one table on the run page: which held, and what was seen."""

from __future__ import annotations

import json
from html import escape

from minigpt.report.html import table
from minigpt.report.run_files import RunFiles


def recorded_checks(run: RunFiles) -> list[tuple[str, str, dict]]:
    """(stage, check, record) for every check the stages recorded, in the order the data flows."""
    sources = (("train", (run.train or {}).get("checks")), ("evaluate", (run.evaluation or {}).get("scoring_checks")),
               ("generate", (run.generation or {}).get("checks")))
    return [(stage, name, record) for stage, checks in sources for name, record in (checks or {}).items()]


def stage_checks_section(run: RunFiles) -> list[str]:
    checks = recorded_checks(run)
    if not checks:
        return []
    rows, classes = [], []
    for stage, name, record in checks:
        seen = {k: v for k, v in record.items() if k != "passed"}
        status = "passed" if record.get("passed") else "failed"
        rows.append([escape(stage), f"<code>{escape(name)}</code>", f'<span class="{status}">{status}</span>',
                     f"<code>{escape(json.dumps(seen, ensure_ascii=False))}</code>"])
        classes.append("" if record.get("passed") else "failed-row")
    return ["<h2>Checks the stages recorded</h2>",
            "<p>What train, evaluate and generate proved about their own run (docs/preflight.md says what each is "
            "compared against).</p>", table(["stage", "check", "result", "what was seen"], rows, classes,
                                            cls="stage-checks")]
