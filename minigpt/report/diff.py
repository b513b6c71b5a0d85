"""Runs compared on the same scored targets (`python -m minigpt.report diff`): per split, B - A in bits per
character with its paired 95% interval (minigpt.evaluate.intervals) and a verdict, and the params that differ;
runs whose params differ only in seeds are compared as seed groups (minigpt.report.groups)."""

from __future__ import annotations

from minigpt.report.compare import differing_params
from minigpt.report.groups import groups_text, has_groups, seed_groups
from minigpt.report.paired import SPLITS, difference_line, paired_split, resampling
from minigpt.report.run_files import RunFiles


def diff_text(a: RunFiles, b: RunFiles) -> str:
    """The terminal table: per split A, B, B - A [95% interval] and the verdict; then the params that differ."""
    lines = [f"A = {a.name}, B = {b.name} (bits per character; paired bootstrap over the same blocks, "
             f"{resampling(a)[0]} resamples)",
             f"{'split':<6} {'A':>8} {'B':>8} {'B - A':>9}  {'95% interval':<21} verdict"]
    lines += [difference_line(f"{split:<6}", paired_split(a, b, split)) for split in SPLITS]
    params = differing_params([a, b])
    lines.append("params that differ: " + ("; ".join(f"{key} {values[0]!r} -> {values[1]!r}" for key, values in params)
                                           if params else "none"))
    return "\n".join(lines)


def diff_runs_text(runs: list[RunFiles]) -> str:
    """Every run against the first one; when the runs hold several settings and one was trained with several
    seeds, every seed group against the first run's group."""
    groups = seed_groups(runs)
    if len(groups) > 1 and has_groups(groups):
        return groups_text(groups)
    return "\n\n".join(diff_text(runs[0], other) for other in runs[1:])
