"""Stage preflight: prove the pipeline on the real data before training; writes reports/debug_report.json."""

from pathlib import Path

from minigpt.diagnostics import PreflightFailed, format_table, run_preflight
from minigpt.stage import stage_main


def run(params):
    report = run_preflight(params, Path("."))
    print(format_table(report["checks"]))
    seconds = report["seconds"]
    print(f"[preflight] checks took {seconds['total']:.2f}s ({seconds['without_overfit']:.2f}s without the overfit check)")
    if not report["passed"]:
        raise PreflightFailed(f"check(s) failed: {', '.join(report['failed'])}; see the table above and reports/debug_report.json")


if __name__ == "__main__":
    raise SystemExit(stage_main("preflight", run))
