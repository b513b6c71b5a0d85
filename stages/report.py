"""Stage report: the run's decision metrics (the five DVC compares in reports/metrics.json, the only DVC metrics
file) and its offline HTML page (reports/report.html, all of them) from the reports the earlier stages wrote."""

from pathlib import Path

from minigpt.core.io_utils import atomic_write_json, atomic_write_text
from minigpt.core.paths import REPORT_HTML, RUN_METRICS
from minigpt.core.provenance import GRAPH_RECORD
from minigpt.core.stage import stage_main
from minigpt.report.custody import require_intact, verify_chain
from minigpt.report.decision import decision_metrics, dvc_metrics
from minigpt.report.run_files import WORKSPACE, load_run, workspace_reader
from minigpt.report.run_page import run_page


def run(params):
    chain = verify_chain(Path("."))
    atomic_write_json(GRAPH_RECORD, chain)
    files = load_run(WORKSPACE, workspace_reader(Path(".")))
    atomic_write_text(REPORT_HTML, run_page(files))  # the page shows a broken link too
    if not chain["intact"]:
        RUN_METRICS.unlink(missing_ok=True)  # an earlier run's metrics must not pass for this one's
    require_intact(chain)
    metrics = dvc_metrics(decision_metrics(files))
    atomic_write_json(RUN_METRICS, metrics)
    print(f"[report] chain of custody intact: {sum(link['status'] == 'ok' for link in chain['links'])} links verified")
    print("[report] " + ", ".join(f"{k} {v}" for k, v in metrics.items()))
    print(f"[report] wrote {RUN_METRICS} and {REPORT_HTML} (open it from disk: no network needed)")


if __name__ == "__main__":
    raise SystemExit(stage_main("report", run))
