"""The decision metrics, the run's offline page and the comparison page: their content, and what a real browser
does with them (no request leaves the machine, no console error, the curves are drawn, a refused run shows why)."""

import json
import math
import re
import shutil
import subprocess
import sys
from html import escape

import pytest

from helpers import REPO_ROOT
from helpers.browser import coloured_pixels, visit
from helpers.pipeline_fixture import copy_project, recompose
from minigpt.core.charts import Series, drawable, line_chart
from minigpt.preflight.checks import describe_time
from minigpt.preflight.refusal_log import PREFIX, in_throwaway_copy, report_from_log, report_log_line
from minigpt.report.compare import compare_page, differing_params
from minigpt.report.decision import DECISION_METRICS, DVC_METRICS, decision_metrics
from minigpt.report.run_files import RunFiles, load_run, workspace_reader

FAST = ["train.max_steps=40", "train.warmup_steps=5", "train.eval_every=10", "train.eval_batches=2",
        "train.sample_length=0", "generate.max_new_tokens=40"]


def run_stages(root, *names):
    for name in names:
        result = subprocess.run([sys.executable, str(REPO_ROOT / "stages" / f"{name}.py")], cwd=root,
                                capture_output=True, text=True)
        if result.returncode:
            return result
    return result


@pytest.fixture(scope="module")
def finished_run(encoded_project, tmp_path_factory):
    """One run through preflight, train, evaluate, generate and report (shared: the tests only read it)."""
    root, source = encoded_project
    root = copy_project(root, tmp_path_factory.mktemp("finished") / "project")
    recompose(root, source, FAST)
    result = run_stages(root, "preflight", "train", "evaluate", "generate", "report")
    assert result.returncode == 0, result.stderr
    return root


def test_the_report_stage_writes_the_decision_metrics_alone_and_the_page(finished_run):
    root = finished_run
    metrics = json.loads((root / "reports/metrics.json").read_text())
    assert list(metrics) == list(DVC_METRICS), "the DVC decision metrics, in the declared order, nothing else"
    assert set(DVC_METRICS) < set(DECISION_METRICS)
    evaluation = json.loads((root / "reports/evaluation.json").read_text())
    assert metrics["val_bpc"] == round(evaluation["val"]["bpc"], 4)
    assert metrics["gap_bpc"] == round(evaluation["generalization_gap"] / math.log(2), 4)
    assert metrics["vs_base"] == round(evaluation["baselines"]["vs_best_static_bpc"], 4)
    best = next(r for r in evaluation["baselines"]["rows"] if r["name"] == evaluation["baselines"]["best_static"])
    assert metrics["vs_base"] == round(evaluation["val"]["bpc"] - best["val"]["bpc"], 4)
    best_step = decision_metrics(load_run("w", workspace_reader(root)))["best_step"]
    assert "best_step" not in metrics and best_step in (10, 20, 30, 40)
    assert all(isinstance(v, (int, float)) for v in metrics.values()), "no strings among the metrics"
    html = (root / "reports/report.html").read_text()
    assert "<script" not in html and " src=" not in html and " href=" not in html, "nothing to load"
    assert html.count('<svg class="chart"') == 4
    assert '<table class="baselines">' in html and '<tr class="model-row"><td><b>this model</b>' in html
    # the fixture's 40-step debug model does not beat an n-gram counted on the same train split: the page says so
    ladder = evaluation["baselines"]
    assert ladder["beats_ngram"] is False and f"The model does not beat the {ladder['best_ngram']} baseline" in html
    # each check's evidence as a person reads it, the whole measurement one click away, the guide's family named
    report = json.loads((root / "reports/debug_report.json").read_text())
    shift = next(c for c in report["checks"] if c["name"] == "batch_shift")["measured"]
    assert shift["decoded_target"][:-1] == shift["decoded_input"][1:], "the decoded target row is the input row shifted"
    assert f"<span class=\"muted\">input row 0:</span> {escape(repr(shift['decoded_input']))}" in html
    tok = next(c for c in report["checks"] if c["name"] == "tokenizer")["measured"]
    assert tok["splits"]["val"]["decoded_start"] == tok["splits"]["val"]["clean_start"]
    assert "val decoded:</span>" in html and "val clean text:</span>" in html and "vocabulary:</span> " in html
    assert "initial loss:</span> " in html and " nats against log V = " in html
    assert html.count("<details><summary>measured (JSON)</summary>") == len(report["checks"])
    assert "<td>correctness</td>" in html and "<td>numerical</td>" in html and "<td>optimisation</td>" in html
    # where preflight's time went, under the checks' table
    assert f'<p class="preflight-time">{escape(describe_time(report["seconds"]))}</p>' in html
    assert f"preflight {report['seconds']['preflight']:.2f} s" in html
    assert "…" not in html.split("<h2>Preflight</h2>")[1].split("<h2>Training</h2>")[0].replace(" …", ""), \
        "no JSON cut mid-value"
    for heading in ("Decision metrics", "Preflight", "Training", "Evaluation", "Samples", "Config and fingerprints"):
        assert f"<h2>{heading}</h2>" in html


def test_the_report_stage_runs_without_importing_torch(finished_run, tmp_path):
    """report only reads records: torch's import (seconds on a small CPU) is not part of its cost."""
    root = shutil.copytree(finished_run, tmp_path / "project", symlinks=True)
    stage = REPO_ROOT / "stages" / "report.py"
    probe = ("import runpy, sys\nsys.argv = [sys.argv[1]]\ncode = 0\ntry:\n"
             "    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit as stop:\n    code = stop.code\n"
             "print(code, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe, str(stage)], cwd=root, capture_output=True, text=True)
    assert result.stdout.split()[-2:] == ["0", "False"], result.stdout + result.stderr
    assert (root / "reports/metrics.json").read_text() == (finished_run / "reports/metrics.json").read_text()


def test_a_refused_run_gets_a_page_that_names_the_failing_check(project):
    root, source = project
    recompose(root, source, FAST + ["train.lr=1.0"])
    assert run_stages(root, "preflight").returncode == 1
    result = subprocess.run([sys.executable, "-m", "minigpt.report", "run"], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    html = (root / "reports/report.html").read_text()
    assert "Preflight failed: lr_stability" in html and '<tr class="failed-row">' in html
    assert "step loss:</span> " in html and "fixed batches:</span> " in html, "a failed check shows its evidence too"
    assert "no training log (training did not run)" in html
    run = load_run("refused", workspace_reader(root))
    assert list(decision_metrics(run)) == ["check_s"], "a refused run has nothing else to compare"
    assert run.preflight_passed is False and [c["name"] for c in run.failed_checks] == ["lr_stability"]


def test_pages_in_a_real_browser_load_nothing_log_no_error_and_draw_the_curves(finished_run, tmp_path):
    root = finished_run
    seen = visit(root / "reports/report.html")
    assert seen.requests == [(root / "reports/report.html").resolve().as_uri()], "only the page itself is read"
    assert seen.console_errors == []
    assert len(seen.chart_screenshots) == 4
    assert all(coloured_pixels(png) > 300 for png in seen.chart_screenshots), "every chart draws its series"
    assert "val_bpc" in seen.text and "Preflight passed" in seen.text

    refused = tmp_path / "refused"
    refused.mkdir()
    (refused / "reports").mkdir()
    (refused / "reports/debug_report.json").write_text(
        json.dumps(_failed_report("lr_stability", "at lr 1 the loss rose from 4.8 to 9.1")))
    runs = [load_run("lr=0.003", workspace_reader(root)), load_run("lr=1.0", workspace_reader(refused))]
    page = tmp_path / "compare.html"
    page.write_text(compare_page(runs))
    seen = visit(page)
    assert seen.requests == [page.resolve().as_uri()] and seen.console_errors == []
    assert any(coloured_pixels(png) > 300 for png in seen.chart_screenshots)
    assert any("lr_stability" in row and "at lr 1 the loss rose" in row for row in seen.failed_rows), seen.failed_rows
    assert "refused" in seen.text


def test_a_chart_without_its_series_counts_as_blank_in_the_browser(tmp_path):
    """The pixel test above can fail: the same chart with no drawable point has no coloured pixel."""
    from minigpt.report.html import page

    path = tmp_path / "blank.html"
    path.write_text(page("blank", [line_chart("loss", [Series("train", [(1, float("nan"))])], "step", "loss")]))
    seen = visit(path)
    assert len(seen.chart_screenshots) == 1 and coloured_pixels(seen.chart_screenshots[0]) == 0


def _failed_report(check: str, message: str) -> dict:
    return {"passed": False, "failed": [check], "checks": [
        {"name": "environment", "status": "passed", "measured": {}, "threshold": "informational", "seconds": 0.0},
        {"name": check, "status": "failed", "measured": {"lr": 1.0}, "threshold": "finite; no sustained rise",
         "seconds": 0.4, "message": message, "likely_causes": ["learning rate too high"]}]}


def test_the_comparison_marks_the_best_value_and_lists_only_differing_params():
    def run(name, val_bpc, lr):
        return RunFiles(name=name, params={"train": {"lr": lr, "seed": 1}},
                        evaluation={"val": {"bpc": val_bpc}, "test": {"bpc": val_bpc}, "generalization_gap": 0.01},
                        train={"best_step": 10, "train_seconds": 5.0, "tokens_per_sec_median": 1000.0})
    runs = [run("a", 3.2, 0.001), run("b", 2.9, 0.003), run("c", 3.0, 0.01)]
    assert differing_params(runs) == [("train.lr", [0.001, 0.003, 0.01])]
    html = compare_page(runs)
    val_row = next(line for line in html.split("<tr>") if "<code>val_bpc</code>" in line)
    assert val_row.count('class="num best"') == 1 and '<td class="num best">2.9000</td>' in val_row


def test_the_comparison_shows_separate_figures_apart_from_the_decision_metrics():
    def run(name, evaluation):
        return RunFiles(name=name, params={"train": {"lr": 0.001, "seed": 1}},
                        evaluation={"val": {"bpc": 2.5}, "test": {"bpc": 2.4}, "generalization_gap": 0.01,
                                    **evaluation})
    plain = run("plain", {})
    assert "no run computed a separate figure" in compare_page([plain, run("also plain", {})])
    figures = {"dynamic": {"lr": 1e-4, "val": {"bpc": 2.3125}, "test": {"bpc": 2.2125}},
               "mixture": {"order": 9, "weight": 0.58, "val": {"bpc": 2.1875}, "test": {"bpc": 2.0875},
                           "ngram": {"val": {"bpc": 2.2625}, "test": {"bpc": 2.1625}}}}
    html = compare_page([plain, run("dyn+mix", figures)])
    table = html.split('<table class="separate-figures">')[1].split("</table>")[0]
    rows = {r.split("</td>")[0].removeprefix("<td>"): r for r in table.split("<tr>")[2:]}
    assert '<td class="num">–</td><td class="num">2.3125</td>' in rows["dynamic evaluation, val bits/char"]
    assert "2.0875" in rows["model + n-gram mixture, test bits/char"]
    assert "9, 0.420" in rows["mixture: n-gram order, its weight"]
    assert "2.2625" in rows["the n-gram alone, val bits/char"]
    metrics = html.split("<h2>Decision metrics</h2>")[1].split("<h2>")[0]
    assert not any(v in metrics for v in ("2.3125", "2.2125", "2.1875", "2.0875"))


def test_charts_skip_what_they_cannot_place_and_say_when_nothing_is_left():
    kept = drawable([Series("train", [(1, 2.0), (2, float("nan")), (3, 1.5), (float("inf"), 1.0)])])
    assert kept[0].points == [(1, 2.0), (3, 1.5)]
    assert drawable([Series("norm", [(1, 0.0), (2, 3.0)])], log_y=True)[0].points == [(2, 3.0)]

    def texts(svg: str) -> list[str]:  # matplotlib draws text as paths and keeps each string in a comment
        return re.findall(r"<!-- (.*?) -->", svg)

    svg = line_chart("loss", [Series("train", [(1, 2.0), (2, float("nan")), (3, 1.5)])], "step", "loss")
    assert svg.startswith('<svg class="chart"') and "<?xml" not in svg and "nan" not in svg.lower()
    assert "train" in texts(svg) and "no data" not in texts(svg)
    assert line_chart("loss", [Series("train", [(1, 2.0), (2, float("nan")), (3, 1.5)])], "step", "loss") == svg
    empty = line_chart("loss", [Series("train", [(1, float("nan"))])], "step", "loss")
    assert "no data" in texts(empty) and "train" not in texts(empty)


def test_a_refused_report_round_trips_through_its_one_log_line():
    report = _failed_report("lr_stability", "at lr 1 the loss rose from 4.8 to 9.1")
    line = report_log_line(report)
    assert "\n" not in line and "measured" not in line and len(line) < 600  # statuses + the failure, not the report
    read = report_from_log("Stage 'preflight' ...\n" + line + "\nERROR: failed to reproduce 'preflight'\n")
    assert read["passed"] is False and read["failed"] == ["lr_stability"]
    assert [(c["name"], c["status"]) for c in read["checks"]] == [("environment", "passed"), ("lr_stability", "failed")]
    failed = read["checks"][1]
    assert failed["message"] == report["checks"][1]["message"] and failed["likely_causes"] == ["learning rate too high"]
    # a log written by an earlier version (the whole report as JSON) still reads
    assert report_from_log("[preflight] report: " + json.dumps(report))["failed"] == ["lr_stability"]
    assert report_from_log("no report here") is None and report_from_log(PREFIX + "{not json") is None


def test_only_a_queued_experiments_throwaway_copy_logs_the_report(tmp_path):
    assert in_throwaway_copy(tmp_path / "project" / ".dvc" / "tmp" / "exps" / "tmpab12cd")
    assert not in_throwaway_copy(tmp_path / "project")
