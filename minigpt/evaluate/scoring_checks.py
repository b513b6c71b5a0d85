"""Evaluation in evaluation mode, measured: while the splits are scored no module may run in training mode (seen
by a ModeProbe attached from outside the scoring code), and scoring is deterministic (two passes over the start of
val agree bitwise). Determinism alone proves nothing at dropout 0, where training mode changes no output: the
probe covers that case."""

from __future__ import annotations

from typing import Callable

import numpy as np

from minigpt.core.errors import MinigptError
from minigpt.model.mode_probe import ModeProbe

# the checks evaluation.json records under "scoring_checks"
SCORING_CHECKS = ("eval_mode", "deterministic")


class ScoringCheckFailed(MinigptError):
    """The scores would not be the model's evaluation-mode scores: no metric is reported."""


def determinism(nll_of: Callable[[np.ndarray], np.ndarray], ids, block_size: int) -> dict:
    """Two passes over the first 2 windows' worth of tokens: every target's NLL equal bit for bit."""
    sample = np.asarray(ids[: min(len(ids), 2 * block_size + 1)])
    first, second = nll_of(sample), nll_of(sample)
    differing = int(np.sum(first != second))
    return {"passed": differing == 0, "targets": int(len(first)), "differing": differing,
            "max_abs_diff": float(np.max(np.abs(first - second))) if len(first) else 0.0}


def scoring_checks(probe: ModeProbe, deterministic: dict, where: str) -> dict:
    """The checks' record for evaluation.json; raises ScoringCheckFailed naming each failed check."""
    checks = {"eval_mode": {"passed": not probe.in_training, **probe.record()}, "deterministic": deterministic}
    problems = []
    if not checks["eval_mode"]["passed"]:
        shown = ", ".join(probe.in_training[:4]) + (" …" if len(probe.in_training) > 4 else "")
        problems.append(f"eval_mode: {len(probe.in_training)} module(s) ran in training mode while scoring ({shown})")
    if not deterministic["passed"]:
        problems.append(f"deterministic: two passes over the first {deterministic['targets']} targets of val "
                        f"differ at {deterministic['differing']} (max |difference| {deterministic['max_abs_diff']:.3g} "
                        "nats)")
    if problems:
        raise ScoringCheckFailed(
            f"{where}: scoring check(s) failed: {'; '.join(problems)}. Scores in training mode (dropout on) are not "
            "the model's scores: score under model.eval(), never switch a module back to train() while scoring. "
            "Not reporting a metric.")
    return checks
