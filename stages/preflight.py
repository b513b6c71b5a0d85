"""Stage preflight: prove the pipeline on the real data before training; writes reports/debug_report.json.

The previous report is removed first, so a crash or a bad params.yaml can never leave an old passing one behind.
"""

from pathlib import Path

from minigpt.core.paths import DEBUG_REPORT
from minigpt.core.stage import stage_main
from minigpt.preflight.checks import describe_time, format_table
from minigpt.preflight.refusal_log import in_throwaway_copy, report_log_line
from minigpt.preflight.suite import discard_report, run_preflight
from minigpt.train.gate import PreflightFailed


def run(params):
    report = run_preflight(params, Path("."))
    print(format_table(report["checks"]))
    if report["machine"]:
        machine = report["machine"]
        print(f"[preflight] {machine['file']} (measured on this machine): precision {machine['precision']}"
              f"{', shape ' + machine['shape'] if machine['shape'] else ''} ({machine['how']})")
    print(f"[preflight] {describe_time(report['seconds'], params.train.max_seconds)}")
    if not report["passed"]:
        if in_throwaway_copy():  # a queued experiment: its log is all that stays of it (`dvc queue logs`)
            print(report_log_line(report))
        raise PreflightFailed(f"check(s) failed: {', '.join(report['failed'])}; see the table above and "
                              "reports/debug_report.json")


if __name__ == "__main__":
    discard_report(Path(DEBUG_REPORT))
    raise SystemExit(stage_main("preflight", run))
