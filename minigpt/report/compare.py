"""Several runs side by side on one offline page: overlaid curves, the decision metrics with the best marked,
the params that differ, and every run's preflight (which run the gate refused, and why).

Runs are named as `dvc exp show` prints them (an experiment's name, a commit, a branch, `workspace`); the
experiments are listed through `dvc.api.exp_show` and their files read through `dvc.api.read`.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from html import escape
from pathlib import Path

from minigpt.core.charts import Series, line_chart
from minigpt.preflight.refusal_log import report_from_log
from minigpt.report.decision import DECISION_METRICS, decision_metrics
from minigpt.report.groups import SEED_KEYS, SeedGroup, group_split, has_groups, mean_sd_text, seed_groups
from minigpt.report.html import fmt, page, table
from minigpt.report.paired import SPLITS, paired_split, resampling
from minigpt.report.run_files import (
    PARAMS_FILE,
    WORKSPACE,
    RunFiles,
    flat_params,
    load_run,
    ngram_weight,
    revision_reader,
    workspace_reader,
)

# experiment states whose commit does not hold the run's results
UNFINISHED = ("Failed", "Queued", "Running")


def experiment_index(root: Path) -> dict[str, dict]:
    """name or revision -> {"rev", "state"} for every experiment `dvc exp show` lists (and their baselines)."""
    import dvc.api

    index = {}
    for row in dvc.api.exp_show(repo=str(root), num=-1):
        rev, name = row.get("rev"), row.get("Experiment")
        entry = {"rev": rev, "state": row.get("State") or ""}
        for key in filter(None, (name, rev, (rev or "")[:7])):
            index.setdefault(key, entry)
    return index


def load_runs(root: Path, names: list[str]) -> list[RunFiles]:
    index = experiment_index(root) if any(n != WORKSPACE for n in names) else {}
    runs = []
    for name in names:
        if name == WORKSPACE:
            runs.append(load_run(name, workspace_reader(root), WORKSPACE))
            continue
        entry = index.get(name, {"rev": name, "state": ""})
        if entry["state"] in UNFINISHED:
            runs.append(unfinished_run(root, name, entry))
        else:
            runs.append(load_run(name, revision_reader(root, entry["rev"]), entry["state"]))
    return runs


def unfinished_run(root: Path, name: str, entry: dict) -> RunFiles:
    """A failed (or queued, running) experiment: its commit holds its params but the baseline's reports, so only
    params.yaml is read from it; a refused run's preflight comes from its log (`dvc queue logs`)."""
    params_only = revision_reader(root, entry["rev"])
    run = load_run(name, lambda path: params_only(path) if path == PARAMS_FILE else None, entry["state"])
    logs = subprocess.run([sys.executable, "-m", "dvc", "queue", "logs", name], cwd=root, capture_output=True,
                          text=True)
    run.preflight = report_from_log(logs.stdout) if logs.returncode == 0 else None
    return run


def differing_params(runs: list[RunFiles]) -> list[tuple[str, list]]:
    flats = [flat_params(r) for r in runs]
    keys = sorted(set().union(*flats))
    return [(k, [f.get(k) for f in flats]) for k in keys if len({repr(f.get(k)) for f in flats}) > 1]


def metrics_comparison(runs: list[RunFiles]) -> str:
    per_run = [decision_metrics(r) for r in runs]
    rows = []
    for key, (what, lower_is_better) in DECISION_METRICS.items():
        values = [m.get(key) for m in per_run]
        present = [v for v in values if isinstance(v, (int, float))]
        best = None
        if lower_is_better is not None and len(present) > 1 and len(set(present)) > 1:
            best = min(present) if lower_is_better else max(present)
        cells = [("num best" if v is not None and v == best else "num", fmt(v)) for v in values]
        rows.append([f"<code>{key}</code>", escape(what), *cells])
    return table(["metric", "what", *[r.name for r in runs]], rows)


def preflight_comparison(runs: list[RunFiles]) -> str:
    names = []
    for run in runs:
        for check in (run.preflight or {}).get("checks", []):
            if check["name"] not in names:
                names.append(check["name"])
    rows, classes = [], []
    for name in names:
        cells, any_failed = [], False
        for run in runs:
            check = next((c for c in (run.preflight or {}).get("checks", []) if c["name"] == name), None)
            if check is None:
                cells.append("–")
                continue
            status = check.get("status", "?")
            any_failed |= status == "failed"
            text = f'<span class="{escape(status)}">{escape(status)}</span>'
            if check.get("message"):
                text += f"<br>{escape(check['message'])}"
            cells.append(text)
        rows.append([escape(name), *cells])
        classes.append("failed-row" if any_failed else "")
    verdict = ["<b>" + ("<span class=\"passed\">passed</span>" if r.preflight_passed else
                        "<span class=\"failed\">refused</span>" if r.preflight_passed is False else "–") + "</b>"
               for r in runs]
    return table(["check", *[r.name for r in runs]], [["gate", *verdict]] + rows, [""] + classes, cls="preflight")


def watchdog_comparison(runs: list[RunFiles]) -> str:
    """Per watchdog, how often it fired in each run and its first message (stops marked)."""
    names = sorted({e["name"] for r in runs for e in r.watchdog_events})
    if not names:
        return '<p class="muted">no watchdog fired in any of these runs</p>'
    rows = []
    for name in names:
        cells = []
        for run in runs:
            fired = [e for e in run.watchdog_events if e["name"] == name]
            cells.append("–" if not fired else
                         f'<span class="failed">{escape(fired[0]["level"])} ×{len(fired)}</span> (step '
                         f'{fmt(fired[0]["step"])})<br>{escape(fired[0]["message"])}')
        rows.append([escape(name), *cells])
    return table(["watchdog", *[r.name for r in runs]], rows, cls="watchdogs")


def _separate_figure_cells(ev: dict) -> dict[str, str]:
    """One run's dynamic-evaluation and mixture figures as label -> cell text (empty when evaluate made neither)."""
    cells = {}
    if dyn := ev.get("dynamic"):
        cells |= {f"dynamic evaluation, {split} bits/char": fmt(dyn[split]["bpc"]) for split in SPLITS}
        cells["dynamic evaluation, lr"] = fmt(dyn["lr"])
    if mix := ev.get("mixture"):
        cells |= {f"model + n-gram mixture, {split} bits/char": fmt(mix[split]["bpc"]) for split in SPLITS}
        cells["mixture: n-gram order, its weight"] = f"{mix['order']}, {fmt(ngram_weight(mix), 3)}"
        cells |= {f"the n-gram alone, {split} bits/char": fmt(mix["ngram"][split]["bpc"]) for split in SPLITS}
    return cells


def separate_figures_comparison(runs: list[RunFiles]) -> str:
    """Dynamic evaluation and the n-gram mixture per run, when any run has them: apart from the decision metrics
    and the paired comparison, which hold each model's own static figures only."""
    per_run = [_separate_figure_cells(r.evaluation or {}) for r in runs]
    labels = list(dict.fromkeys(label for cells in per_run for label in cells))  # first seen first, once each
    if not labels:
        return ('<p class="muted">no run computed a separate figure (<code>evaluate.dynamic</code>, '
                "<code>evaluate.mixture_order</code>)</p>")
    rows = [[escape(label), *[("num", cells.get(label, "–")) for cells in per_run]] for label in labels]
    return ('<p class="muted">Separate figures, never a model\'s own val/test or its decision metrics: dynamic '
            "evaluation keeps learning on the text it scores; the mixture adds an n-gram counted on train.</p>"
            + table(["figure", *[r.name for r in runs]], rows, cls="separate-figures"))


CURVES = (("validation loss", "val_loss", "nats per character", True, False),
          ("training loss", "train_loss", "nats per character", False, False),
          ("learning rate", "lr", "lr", False, False),
          ("gradient norm (before clipping)", "grad_norm", "norm", False, True))


def _points(run: RunFiles, key: str) -> list[tuple[float, float]]:
    return [(rec["step"], rec[key]) for rec in run.train_log if key in rec]


def _group_series(group: SeedGroup, key: str, markers: bool) -> Series:
    """The group's mean at each step its runs logged, and the band from their lowest to their highest value."""
    by_step: dict[float, list[float]] = {}
    for run in group.runs:
        for step, value in _points(run, key):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    return Series(f"{group.label} ({len(group.runs)})", [(x, statistics.fmean(by_step[x])) for x in steps],
                  markers=markers, band=[(x, min(by_step[x]), max(by_step[x])) for x in steps])


def overlaid_charts(runs: list[RunFiles]) -> str:
    """One line per run; when a setting was trained with several seeds, one line per seed group (its mean) with
    the range over its seeds as a band."""
    groups = seed_groups(runs)
    grouped = has_groups(groups)
    charts = []
    for title, key, unit, markers, log_y in CURVES:
        series = ([_group_series(group, key, markers) for group in groups] if grouped else
                  [Series(r.name, _points(r, key), markers=markers) for r in runs])
        charts.append(line_chart(title, series, "step", unit, log_y=log_y))
    note = ('<p class="muted">One line per seed group: the mean of its runs, shaded from their lowest to their '
            "highest value at each step (legend: the group, its number of runs).</p>" if grouped else "")
    return note + '<div class="charts">' + "".join(charts) + "</div>"


AGAINST_BEST_COLUMNS = ["val B - A", "val 95% interval", "val", "test B - A", "test 95% interval", "test"]


def against_best_rows(items: list, best, name_of, compare) -> list[list]:
    """A table row per item but the best: per split, B - A, its 95% interval and the verdict (`compare(best, item,
    split)` gives them, or a verdict saying why not)."""
    rows = []
    for item in items:
        if item is best:
            continue
        cells = [escape(name_of(item))]
        for split in SPLITS:
            row = compare(best, item, split)
            if "difference" in row:
                low, high = row["ci95"]
                cells += [("num", f"{row['difference']:+.4f}"), ("num", f"[{low:+.4f}, {high:+.4f}]"),
                          escape(row["verdict"].replace("B is", "is"))]
            else:
                cells += ["–", "–", escape(row["verdict"])]
        rows.append(cells)
    return rows


def paired_comparison(runs: list[RunFiles]) -> str:
    """Every run against the one with the best val bpc: B - A per split with its paired 95% interval."""
    scored = [r for r in runs if isinstance(((r.evaluation or {}).get("val") or {}).get("bpc"), (int, float))]
    if len(scored) < 2:
        return '<p class="muted">fewer than two evaluated runs</p>'
    best = min(scored, key=lambda r: r.evaluation["val"]["bpc"])
    note = (f'<p class="muted">B = each run, A = the best val bpc ({escape(best.name)}); intervals from a paired '
            f"bootstrap over the same blocks of the scored targets ({resampling(best)[0]} resamples).</p>")
    return note + table(["run", *AGAINST_BEST_COLUMNS], against_best_rows(runs, best, lambda r: r.name, paired_split))


def groups_comparison(runs: list[RunFiles]) -> str:
    """Each seed group's mean ± sd, and every group against the one with the best mean val bpc."""
    groups = seed_groups(runs)
    if not has_groups(groups):
        return ('<p class="muted">no setting was trained more than once (runs whose params differ only in '
                f"{', '.join(SEED_KEYS)} form a group)</p>")
    rows = [[escape(g.label), escape(", ".join(r.name for r in g.runs)), escape(", ".join(map(str, g.seeds))),
             *[("num", escape(mean_sd_text(g.summary(split)))) for split in SPLITS]] for g in groups]
    summary = table(["group", "runs", "train.seed", "val bpc, mean ± sd", "test bpc, mean ± sd"], rows)
    scored = [g for g in groups if g.summary("val")["mean"] is not None]
    if len(scored) < 2:
        return summary
    best = min(scored, key=lambda g: g.summary("val")["mean"])
    note = (f'<p class="muted">B = each group, A = the best mean val bpc ({escape(best.label)}); the interval holds '
            "the spread over seeds (Welch's t) and over the text (paired bootstrap of the blocks).</p>")
    return summary + note + table(["group", *AGAINST_BEST_COLUMNS],
                                  against_best_rows(groups, best, lambda g: g.label, group_split))


def compare_page(runs: list[RunFiles]) -> str:
    params = differing_params(runs)
    states = ", ".join(f"{escape(r.name)} ({escape(r.state)})" if r.state else escape(r.name) for r in runs)
    body = [f"<h1>minigpt: {len(runs)} runs compared</h1>", f'<p class="muted">{states}. One self-contained file: '
            "no script, nothing loaded from the network. Best value per metric highlighted.</p>",
            "<h2>Decision metrics</h2>", metrics_comparison(runs),
            "<h2>Against the best run, paired</h2>", paired_comparison(runs),
            "<h2>Seed groups</h2>", groups_comparison(runs),
            "<h2>Separate figures</h2>", separate_figures_comparison(runs),
            "<h2>Params that differ</h2>",
            table(["param", *[r.name for r in runs]], [[f"<code>{escape(k)}</code>", *[fmt(v) for v in values]]
                                                     for k, values in params]) if params
            else '<p class="muted">the runs share every param</p>',
            "<h2>Curves</h2>", overlaid_charts(runs),
            "<h2>Preflight</h2>", preflight_comparison(runs),
            "<h2>Watchdogs</h2>", watchdog_comparison(runs)]
    return page(f"minigpt: {', '.join(r.name for r in runs)}", body)
