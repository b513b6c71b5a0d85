"""Two runs compared on the same scored targets: per split, B - A in bits per character with its paired 95%
interval (minigpt.evaluate.intervals) and a verdict, and the params that differ (`python -m minigpt.report diff`)."""

from __future__ import annotations

import math

from minigpt.evaluate.intervals import paired_difference
from minigpt.report.compare import differing_params
from minigpt.report.run_files import RunFiles

RESAMPLES, SEED = 2000, 0  # as evaluate's defaults: the same blocks give the same interval
SPLITS = ("val", "test")


def paired_split(a: RunFiles, b: RunFiles, split: str) -> dict:
    """{"a", "b", "difference", "ci95", "verdict"} for one split, or {"verdict": why it cannot be compared}."""
    blocks = [(run.eval_blocks or {}).get("splits", {}).get(split) for run in (a, b)]
    missing = [run.name for run, kept in zip((a, b), blocks) if not kept]
    if missing:
        return {"verdict": f"not comparable: no reports/eval_blocks.json for {', '.join(missing)} (evaluate again)"}
    first, second = blocks
    if first.get("sha256") != second.get("sha256"):
        return {"verdict": "not comparable: the runs scored different text (the split's SHA-256 differs)"}
    if first.get("tokens") != second.get("tokens"):
        return {"verdict": "not comparable: the runs cut the split into different blocks (evaluate.blocks differs)"}
    paired = paired_difference(first["nll"], second["nll"], first["tokens"], RESAMPLES, SEED)
    low, high = paired["ci95"]
    verdict = ("B is better" if high < 0 else "B is worse" if low > 0 else "no detectable difference")
    bpc = [sum(kept["nll"]) / sum(kept["tokens"]) / math.log(2) for kept in blocks]
    return {"a": bpc[0], "b": bpc[1], **paired, "verdict": verdict}


def diff_text(a: RunFiles, b: RunFiles) -> str:
    """The terminal table: per split A, B, B - A [95% interval] and the verdict; then the params that differ."""
    lines = [f"A = {a.name}, B = {b.name} (bits per character; paired bootstrap over the same blocks, "
             f"{RESAMPLES} resamples)",
             f"{'split':<6} {'A':>8} {'B':>8} {'B - A':>9}  {'95% interval':<21} verdict"]
    for split in SPLITS:
        row = paired_split(a, b, split)
        if "difference" not in row:
            lines.append(f"{split:<6} {row['verdict']}")
            continue
        low, high = row["ci95"]
        lines.append(f"{split:<6} {row['a']:>8.4f} {row['b']:>8.4f} {row['difference']:>+9.4f}  "
                     f"[{low:+.4f}, {high:+.4f}]  {row['verdict']}")
    params = differing_params([a, b])
    lines.append("params that differ: " + ("; ".join(f"{key} {values[0]!r} -> {values[1]!r}" for key, values in params)
                                           if params else "none"))
    return "\n".join(lines)
