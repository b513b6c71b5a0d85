"""python -m minigpt.report run [--out reports/report.html]         this workspace's run
   python -m minigpt.report compare NAME NAME … [--out compare.html] runs as `dvc exp show` names them
   python -m minigpt.report diff A B [C …]                           B - A per split, with a paired 95% interval;
                                                                     runs differing only in seeds compared as groups"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minigpt.core.errors import MinigptError
from minigpt.core.io_utils import atomic_write_text
from minigpt.core.paths import REPORT_HTML


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigpt.report", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="the workspace's run (also after a refused preflight)")
    run.add_argument("--out", type=Path, default=Path(REPORT_HTML))
    compare = sub.add_parser("compare", help="several runs on one page")
    compare.add_argument("names", nargs="+", help="experiment names, commits, branches, or 'workspace'")
    compare.add_argument("--out", type=Path, default=Path("reports/compare.html"))
    diff = sub.add_parser("diff", help="B - A per split with a paired 95%% interval, and a verdict; runs whose "
                          "params differ only in seeds are compared as seed groups (each against the first)")
    diff.add_argument("a", help="experiment name, commit, branch, or 'workspace'")
    diff.add_argument("b", nargs="+", help="experiment name, commit, branch, or 'workspace' (several: more runs)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the project root (default: .)")
    args = parser.parse_args(argv)
    try:
        if args.command == "diff":
            from minigpt.report.compare import load_runs
            from minigpt.report.diff import diff_runs_text

            print(diff_runs_text(load_runs(args.repo, [args.a, *args.b])))
            return 0
        if args.command == "run":
            from minigpt.report.run_files import WORKSPACE, load_run, workspace_reader
            from minigpt.report.run_page import run_page

            html = run_page(load_run(WORKSPACE, workspace_reader(args.repo)))
        else:
            from minigpt.report.compare import compare_page, load_runs

            html = compare_page(load_runs(args.repo, args.names))
    except MinigptError as exc:
        print(f"[report] {exc}", file=sys.stderr)
        return 1
    atomic_write_text(args.out, html)
    print(f"[report] wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
