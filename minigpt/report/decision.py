"""The decision metrics: the few numbers a person compares runs on. The run and comparison pages show all of
them; five of them (DVC_METRICS) are the only numbers DVC treats as metrics (reports/metrics.json), so that
`dvc exp show` of a sweep fits a 120-column terminal with the swept param (DVC puts every metric before the first
param, after ~60 columns of its own). Everything else a run measured stays in its reports.

Whether preflight passed is not among them: a run that DVC records has passed it by construction (train refuses
otherwise, and the experiment fails), so the column could only read 1. The run report and the comparison page
show it, refused runs included.
"""

from __future__ import annotations

import math

from minigpt.report.run_files import RunFiles

# key -> (what it is, whether lower is better): the order is the column order of the pages and `dvc exp show`
DECISION_METRICS = {
    "val_bpc": ("validation bits per character (full split)", True),
    "test_bpc": ("test bits per character (full split)", True),
    "gap_bpc": ("generalisation gap: val minus an equal slice of train, bits per character", True),
    "vs_base": ("val bits per character minus the best static baseline's (n-gram, unigram, uniform): below 0 = the "
                "model beats them all", True),
    "best_step": ("step of the best validation loss (the checkpoint evaluated)", None),
    "train_s": ("training wall clock, seconds", True),
    "tok_s": ("training tokens per second (median step)", False),
    "check_s": ("seconds of preflight's slowest check", True),
    "rep4": ("share of repeated character 4-grams in the samples (mean)", True),
    "warnings": ("watchdog warnings during training (docs/preflight.md, Watchdogs)", True),
}
# the ones in reports/metrics.json (`dvc exp show`, `dvc metrics diff`); train_s, check_s and rep4 are on the pages
# (best_step stays on the pages: vs_base took its place, so that train.lr still ends within 120 columns)
DVC_METRICS = ("val_bpc", "test_bpc", "vs_base", "gap_bpc", "tok_s")


def _round(value, digits: int = 4):
    if isinstance(value, float) and math.isfinite(value):
        return round(value, digits)
    return value


def decision_metrics(run: RunFiles) -> dict:
    """The decision metrics of a run, in DECISION_METRICS order; a metric whose report is missing is left out."""
    out = {}
    if run.evaluation:
        ev = run.evaluation
        out.update(val_bpc=ev["val"]["bpc"], test_bpc=ev["test"]["bpc"],
                   gap_bpc=ev.get("generalization_gap_bpc", ev["generalization_gap"] / math.log(2)))
        if "baselines" in ev:
            out.update(vs_base=ev["baselines"]["vs_best_static_bpc"])
    if run.train:
        out.update(best_step=run.train["best_step"], train_s=run.train["train_seconds"],
                   tok_s=run.train["tokens_per_sec_median"])
    if run.preflight:
        checks = run.preflight.get("checks", [])
        out.update(check_s=max((c.get("seconds", 0.0) for c in checks), default=0.0))
    if run.generation:
        out.update(rep4=run.generation["mean"]["repeated_4gram_share"])
    if run.train and "warnings" in run.train:
        out.update(warnings=run.train["warnings"])
    elif run.train_log:  # a run a watchdog stopped: no summary, the log has the events
        out.update(warnings=sum(e.get("level") == "warning" for e in run.watchdog_events))
    return {key: _round(out[key], 1 if key == "tok_s" else 4) for key in DECISION_METRICS if key in out}


def dvc_metrics(metrics: dict) -> dict:
    """The decision metrics DVC compares (DVC_METRICS), in that order."""
    return {key: metrics[key] for key in DVC_METRICS if key in metrics}
