"""Stage report: the run's decision metrics (the five DVC compares in reports/metrics.json, the only DVC metrics
file) and its offline HTML page (reports/report.html, all of them) from the reports the earlier stages wrote."""

from pathlib import Path

from minigpt.core.io_utils import atomic_write_json, atomic_write_text
from minigpt.core.paths import REPORT_HTML, RUN_METRICS
from minigpt.core.stage import stage_main
from minigpt.report.decision import decision_metrics, dvc_metrics
from minigpt.report.run_files import WORKSPACE, load_run, workspace_reader
from minigpt.report.run_page import run_page


def run(params):
    files = load_run(WORKSPACE, workspace_reader(Path(".")))
    metrics = dvc_metrics(decision_metrics(files))
    atomic_write_json(RUN_METRICS, metrics)
    atomic_write_text(REPORT_HTML, run_page(files))
    print("[report] " + ", ".join(f"{k} {v}" for k, v in metrics.items()))
    print(f"[report] wrote {RUN_METRICS} and {REPORT_HTML} (open it from disk: no network needed)")


if __name__ == "__main__":
    raise SystemExit(stage_main("report", run))
