"""The default test tier's wall time against an earlier revision's, side by side on this machine: both revisions
cloned into a scratch folder and run one after the other, each with its own Makefile's `test` command, through the
same virtual environment; and the test ids the earlier revision collects that this one does not.

    python benchmarks/default_tier.py --baseline c1ac7b5

Nothing else should run meanwhile: both tiers use every core. About 25 minutes on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import ROOT, machine_label, output_path, write_result


def tier_command(makefile: str) -> list[str]:
    """The `test` target's pytest command of a Makefile, its make variables given their defaults."""
    recipe = re.search(r"^test: .*\n\t(.+)$", makefile, re.MULTILINE)
    if recipe is None:
        raise SystemExit("no `test:` target with a one-line recipe in the Makefile")
    line = recipe.group(1).replace("$(BIN)/python", "python").replace("$(PYTEST_ARGS)", "")
    jobs = re.search(r"^JOBS \?= (\S+)$", makefile, re.MULTILINE)
    line = line.replace("$(JOBS)", jobs.group(1) if jobs else "auto")
    return shlex.split(line)


def clone(revision: str, into: Path) -> str:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", revision], check=True)
    return subprocess.run(["git", "-C", str(into), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run_tier(folder: Path, smoke: bool) -> dict:
    """The revision's default tier (--smoke: one test file), timed; its outcome counts from pytest's last line."""
    command = tier_command((folder / "Makefile").read_text())
    args = [sys.executable, *command[1:], "-p", "no:cacheprovider", "-q"]
    if smoke:
        args.append("tests/test_config.py")
    env = {**os.environ, "PYTHONPATH": str(folder)}
    started = time.perf_counter()
    done = subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode != 0:  # a timing of a failed tier is no result
        raise SystemExit(f"{folder}: `{shlex.join(args)}` exited {done.returncode}: {last or done.stderr[-500:]}")
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|errors?|skipped)", last)}
    return {"command": shlex.join(command), "wall_s": round(wall, 1), "returncode": done.returncode,
            "summary": last, **counts}


def collected_ids(folder: Path) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=folder, env={**os.environ, "PYTHONPATH": str(folder)},
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{folder}: pytest --collect-only exited {done.returncode}: {done.stdout[-500:]}")
    return {line for line in done.stdout.splitlines() if "::" in line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the earlier revision (a commit or tag)")
    parser.add_argument("--revision", default="HEAD", help="the revision measured against it (default HEAD)")
    parser.add_argument("--smoke", action="store_true", help="one test file each (the code path, not a figure)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="minigpt-default-tier-"))
    tiers = {}
    for role, revision in (("baseline", args.baseline), ("revision", args.revision)):
        commit = clone(revision, scratch / role)
        tiers[role] = {"commit": commit, **run_tier(scratch / role, args.smoke)}
        print(f"{role} {commit[:10]}: {tiers[role]['summary']} ({tiers[role]['wall_s']} s)", flush=True)
    ids = {role: collected_ids(scratch / role) for role in tiers}
    missing = sorted(ids["baseline"] - ids["revision"])
    ratio = tiers["baseline"]["wall_s"] / tiers["revision"]["wall_s"]
    change = 1 - 1 / ratio
    print(f"the revision's tier takes {abs(change):.0%} {'less' if change >= 0 else 'more'} wall time ({ratio:.2f}x); "
          f"{len(missing)} of the baseline's {len(ids['baseline'])} test ids are not collected by the revision")
    out = output_path(args.out, "default_tier", args.smoke)
    write_result(out, {"machine": machine_label(), "tiers": tiers, "speedup": round(ratio, 3),
                       "ids": {"baseline": len(ids["baseline"]), "revision": len(ids["revision"]),
                               "baseline_only": missing}, "smoke": args.smoke})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
