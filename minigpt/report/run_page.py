"""One run's offline report (reports/report.html): the preflight table, the training curves, the evaluation
with its baseline, the samples, and the config and fingerprints the run was bound to."""

from __future__ import annotations

import json
from html import escape

from minigpt.core.charts import Series, line_chart
from minigpt.core.choice_text import how_chosen
from minigpt.preflight.checks import describe_time
from minigpt.report.custody_view import custody_section
from minigpt.report.decision import DECISION_METRICS, decision_metrics
from minigpt.report.evidence import evidence
from minigpt.report.html import fmt, page, table
from minigpt.report.run_files import RunFiles, ngram_weight
from minigpt.report.stage_checks_view import stage_checks_section


def precision_line(what: str, record: dict | None) -> str:
    """How a precision was chosen: as configured, or (auto) both timings on the machine and the faster."""
    if not record:
        return ""
    return f"<p>{what}: <b>{escape(str(record.get('choice')))}</b> ({escape(how_chosen(record))})</p>"


def machine_line(record: dict | None) -> str:
    """The machine's measured choice the run used (conf/machine/): its precision, its shape and how it was chosen."""
    if not record:
        return ""
    shape = f", shape <b>{escape(str(record.get('shape')))}</b>" if record.get("shape") else ""
    return (f"<p>this machine's choice ({escape(str(record.get('file')))}): precision "
            f"<b>{escape(str(record.get('precision')))}</b>{shape} ({escape(str(record.get('how')))})</p>")


def preflight_section(run: RunFiles) -> list[str]:
    if run.preflight is None:
        return ["<h2>Preflight</h2>", '<p class="muted">no preflight report (preflight has not run)</p>']
    report = run.preflight
    failed = run.failed_checks
    budget_seconds = ((report.get("config") or {}).get("train") or {}).get("max_seconds")
    if report.get("passed"):
        banner = ('<div class="banner passed"><span class="passed">Preflight passed</span>: every check held, so '
                  'training was allowed to start.</div>')
    else:
        names = ", ".join(c["name"] for c in failed) or "?"
        banner = (f'<div class="banner failed"><span class="failed">Preflight failed: {escape(names)}</span>. '
                  "The gate refused to train this run.</div>")
    rows, classes = [], []
    banner += machine_line(report.get("machine"))
    for i, check in enumerate(report.get("checks", []), 1):
        status = check.get("status", "?")
        detail = escape(check.get("message", ""))
        if check.get("likely_causes"):
            detail += "<br><span class=\"muted\">likely: " + escape("; ".join(check["likely_causes"])) + "</span>"
        rows.append([("num", str(i)), escape(check.get("name", "?")), escape(check.get("family", "")),
                     f'<span class="{escape(status)}">{escape(status)}</span>', escape(str(check.get("threshold", ""))),
                     evidence_cell(check), ("num", fmt(check.get("seconds"), 2)), detail])
        classes.append("failed-row" if status == "failed" else "")
    return ["<h2>Preflight</h2>", banner,
            table(["#", "check", "family", "status", "passes when", "evidence", "s", "message / likely cause"], rows,
                  classes, cls="preflight"),
            f'<p class="preflight-time">{escape(describe_time(report.get("seconds") or {}, budget_seconds))}</p>']


def evidence_cell(check: dict) -> str:
    """What the check measured, as a person reads it, with the whole measurement one click away."""
    lines = "".join(f"<div><span class=\"muted\">{escape(label)}:</span> {escape(text)}</div>"
                    for label, text in evidence(check))
    full = escape(json.dumps(check.get("measured", {}), indent=1, ensure_ascii=False, default=str))
    return f'{lines}<details><summary>measured (JSON)</summary><pre>{full}</pre></details>'



def training_section(run: RunFiles) -> list[str]:
    if not run.train_log:
        return ["<h2>Training</h2>", '<p class="muted">no training log (training did not run)</p>']
    log = run.train_log
    val = [(r["step"], r["val_loss"]) for r in log if "val_loss" in r]
    charts = [
        line_chart("loss", [Series("train", [(r["step"], r["train_loss"]) for r in log]),
                            Series("val", val, markers=True)], "step", "nats per character"),
        line_chart("learning rate", [Series("lr", [(r["step"], r["lr"]) for r in log])], "step", "lr"),
        line_chart("gradient norm (before clipping)", [Series("grad norm", [(r["step"], r["grad_norm"]) for r in log])],
                   "step", "norm", log_y=True),
        line_chart("throughput", [Series("tokens/s", [(r["step"], r["tokens_per_sec"]) for r in log])], "step",
                   "tokens/s"),
    ]
    summary = run.train or {}
    facts = [("steps", summary.get("steps", log[-1]["step"])), ("stopped by", summary.get("stopped_by")),
             ("best val loss", summary.get("best_val_loss")), ("best step", summary.get("best_step")),
             ("clipped share of steps", summary.get("clipped_fraction")),
             ("tokens/s (median step)", summary.get("tokens_per_sec_median")),
             ("training seconds", summary.get("train_seconds")), ("device", summary.get("device")),
             ("precision", summary.get("precision")), ("processes", summary.get("world_size")),
             ("resumed from step", summary.get("resumed_from_step"))]
    return ["<h2>Training</h2>", table(["", ""], [[escape(k), ("num", fmt(v))] for k, v in facts]),
            f'<div class="charts">{"".join(charts)}</div>', *watchdog_block(run)]


def watchdog_block(run: RunFiles) -> list[str]:
    """What the watchdogs saw: each one's level, how often it was judged and fired, its first message."""
    events = run.watchdog_events
    summary = ((run.train or {}).get("watchdogs") or {}).get("checks")
    out = ["<h3>Watchdogs</h3>"]
    stops = [e for e in events if e.get("level") == "stop"]
    if stops:
        out.append(f'<div class="banner failed"><span class="failed">Stopped by the {escape(stops[-1]["name"])} '
                   f'watchdog at step {fmt(stops[-1]["step"])}</span>: {escape(stops[-1]["message"])}</div>')
    warned = sorted({e["name"] for e in events if e.get("level") == "warning"})
    if warned:
        out.append(f'<div class="banner failed"><span class="failed">Warnings: {escape(", ".join(warned))}</span> '
                   "(the run went on; see below).</div>")
    elif summary and not stops:
        out.append('<p><span class="passed">No watchdog fired</span> during training.</p>')
    rows, classes = [], []
    names = list(summary or {}) or sorted({e["name"] for e in events})
    for name in names:
        first = next((e for e in events if e["name"] == name), None)
        tally = (summary or {}).get(name, {})
        fired = tally.get("fired", sum(e["name"] == name for e in events))
        rows.append([escape(name), escape(str(tally.get("level", first["level"] if first else ""))),
                     ("num", fmt(tally.get("evaluated"))), ("num", fmt(fired)),
                     ("num", fmt(first["step"] if first else None)), escape(first["message"] if first else "")])
        classes.append("failed-row" if fired else "")
    if rows:
        out.append(table(["watchdog", "level", "judged", "fired", "first step", "first message"], rows, classes,
                         cls="watchdogs"))
    return out if len(out) > 1 else []


def evaluation_section(run: RunFiles) -> list[str]:
    ev = run.evaluation
    if ev is None:
        return ["<h2>Evaluation</h2>", '<p class="muted">no evaluation (evaluate has not run)</p>']
    rows = [[split, ("num", fmt(ev[key]["loss"])), ("num", fmt(ev[key]["bpc"])), ("num", fmt(ev[key]["perplexity"], 3)),
             ("num", fmt(ev[key]["tokens"])), ("num", fmt(ev[key].get("characters", ev[key]["tokens"])))]
            for split, key in (("val", "val"), ("test", "test"), ("train slice", "train_slice"))]
    rows.append(["random baseline (log V per token)", ("num", fmt(ev["baseline_log_v"])), "", "", "", ""])
    return ["<h2>Evaluation</h2>", *baselines_block(ev.get("baselines")), *separate_figures_block(ev),
            f"<p>Every target token of each split scored once (stride {ev.get('stride')}, at least "
            f"{ev.get('min_context')} characters of context), checkpoint "
            f"<code>{escape(str(ev.get('checkpoint')))}</code>, best step {fmt(ev.get('best_step'))}. Generalisation "
            f"gap (val − train slice): {fmt(ev.get('generalization_gap'))} "
            "nats per token.</p>", precision_line("evaluation precision", ev.get("precision")),
            table(["split", "loss (nats/token)", "bits/char", "perplexity (per token)", "tokens", "characters"], rows)]


def baselines_block(ladder: dict | None) -> list[str]:
    """The model among the classical baselines on the same targets, best last; a flag when an n-gram beats it."""
    if not ladder:
        return []
    out = []
    if ladder.get("beats_ngram") is False:
        out.append(f'<div class="banner failed"><span class="failed">The model does not beat the '
                   f'{escape(str(ladder.get("best_ngram")))} baseline</span> counted on the same train split: more '
                   "steps, a larger model or a better LR would pay before anything else.</div>")
    else:
        margin, best = ladder["vs_best_static_bpc"], escape(str(ladder.get("best_static")))
        out.append(f"<p>The model beats the best static baseline ({best}) by {fmt(-margin)} bits per character on "
                   "val.</p>" if margin < 0 else
                   f"<p>The model does not beat the best static baseline ({best}): {fmt(margin)} bits per character "
                   "behind it on val.</p>")
    kinds = {"static": "static: fitted on train, then frozen", "model": "this run's checkpoint",
             "adaptive": "adaptive: keeps learning on the split as it codes it (not the same kind of model)"}
    rows, classes = [], []
    for row in ladder["rows"]:
        rows.append([f"<b>{escape(row['name'])}</b>" if row["kind"] == "model" else escape(row["name"]),
                     escape(kinds.get(row["kind"], row["kind"])), *bpc_cells(row), ("num", fmt(row.get("seconds"), 1))])
        classes.append("model-row" if row["kind"] == "model" else "")
    out.append(table(["predictor", "kind", "val bits/char", "test bits/char", "fit s"], rows, classes, cls="baselines"))
    return out


def bpc_cells(figure: dict) -> list[tuple[str, str]]:
    """A figure's val and test bits per character as two right-aligned cells."""
    return [("num", fmt(figure[split]["bpc"])) for split in ("val", "test")]


def separate_figures_block(ev: dict) -> list[str]:
    """Dynamic evaluation and the n-gram mixture, when evaluate computed them: each under its own label, apart from
    the ladder and the metrics (neither is the model's own static figure)."""
    rows = []
    if ev.get("dynamic"):
        dyn = ev["dynamic"]
        rows.append([f"dynamic evaluation (lr {dyn['lr']:g})", escape(str(dyn.get("label", ""))), *bpc_cells(dyn)])
    if ev.get("mixture"):
        mix = ev["mixture"]
        rows.append([f"model + {mix['order']}-gram (the n-gram's weight {fmt(ngram_weight(mix), 3)})",
                     escape(str(mix.get("label", ""))), *bpc_cells(mix)])
        rows.append([f"the {mix['order']}-gram alone", "counted on the encoded train split, the mixture's other side",
                     *bpc_cells(mix["ngram"])])
    if not rows:
        return []
    return ['<p class="muted">Separate figures, never the model\'s own val/test, the ladder or the metrics:</p>',
            table(["figure", "what it is", "val bits/char", "test bits/char"], rows, cls="separate-figures")]


def samples_section(run: RunFiles) -> list[str]:
    gen = run.generation
    if gen is None:
        return ["<h2>Samples</h2>", '<p class="muted">no samples (generate has not run)</p>']
    settings = gen.get("settings", {})
    out = ["<h2>Samples</h2>",
           f"<p>temperature {fmt(settings.get('temperature'))}, top_k {fmt(settings.get('top_k'))}, top_p "
           f"{fmt(settings.get('top_p'))}, repetition penalty {fmt(settings.get('repetition_penalty'))}, "
           f"{fmt(settings.get('max_new_tokens'))} new characters, seed {fmt(settings.get('seed'))}</p>"]
    for i, sample in enumerate(gen.get("samples", []), 1):
        out.append(f"<h3>Prompt {i}</h3><pre><b>{escape(sample['prompt'])}</b>{escape(sample['text'])}</pre>"
                   f"<p class=\"muted\">repeated 4-grams {fmt(sample.get('repeated_4gram_share'))}, 8-grams "
                   f"{fmt(sample.get('repeated_8gram_share'))}, longest repeated substring "
                   f"{fmt(sample.get('longest_repeated_substring'))} chars, longest run of one character "
                   f"{fmt(sample.get('longest_char_run'))}</p>")
    return out


def config_section(run: RunFiles) -> list[str]:
    out = ["<h2>Config and fingerprints</h2>"]
    report = run.preflight or {}
    if report.get("config"):
        out.append("<p>What the gate binds (from the preflight report):</p>"
                   f"<pre>{escape(json.dumps(report['config'], indent=1, ensure_ascii=False))}</pre>")
    fingerprints = report.get("fingerprints")
    if fingerprints:
        code = fingerprints.get("code", {})
        short = {k: v for k, v in fingerprints.items() if k != "code"}
        short["code"] = code.get("digest")
        out.append(f"<pre>{escape(json.dumps(short, indent=1, ensure_ascii=False))}</pre>")
        if code.get("files"):
            out.append("<details><summary>code files</summary><pre>" + escape(
                "\n".join(f"{sha[:16]}  {name}" for name, sha in sorted(code["files"].items()))) + "</pre></details>")
    if run.params:
        out.append("<details><summary>params.yaml</summary><pre>" +
                   escape(json.dumps(run.params, indent=1, ensure_ascii=False)) + "</pre></details>")
    return out


def metrics_table(run: RunFiles) -> str:
    metrics = decision_metrics(run)
    rows = [[f"<code>{key}</code>", escape(DECISION_METRICS[key][0]),
             ("num", fmt(value))] for key, value in metrics.items()]
    if run.evaluation:
        rows.append(["baseline", "random baseline: log2 of the vocabulary size, bits per character",
                     ("num", fmt(run.evaluation["baseline_bpc"]))])
    return table(["metric", "what", "value"], rows)


def run_page(run: RunFiles) -> str:
    body = [f"<h1>minigpt run report: {escape(run.name)}</h1>",
            '<p class="muted">One self-contained file: no script, nothing loaded from the network.</p>',
            "<h2>Decision metrics</h2>", metrics_table(run)]
    for section in (custody_section, preflight_section, training_section, stage_checks_section, evaluation_section,
                    samples_section, config_section):
        body.extend(section(run))
    return page(f"minigpt run report: {run.name}", body)
