"""Two runs scored on the same targets, compared paired: per split, B - A in bits per character with its 95%
interval over the same blocks (minigpt.evaluate.intervals) and a verdict; what `report diff` prints and the
comparison page shows against the best run."""

from __future__ import annotations

import math

from minigpt.evaluate.intervals import paired_difference
from minigpt.report.run_files import RunFiles

# what A's evaluation resampled with (reports/eval_blocks.json); these for a file written before it recorded them
DEFAULT_RESAMPLES, DEFAULT_SEED = 2000, 0
SPLITS = ("val", "test")


def characters(kept: dict) -> list[int]:
    """Each block's characters, the bpc denominators (a file written before it kept them: its tokens, which were
    characters then)."""
    return kept.get("chars") or kept["tokens"]


def resampling(run: RunFiles) -> tuple[int, int]:
    """(resamples, seed) the run's evaluation used for its own intervals: the paired comparison uses the same."""
    kept = run.eval_blocks or {}
    return kept.get("resamples", DEFAULT_RESAMPLES), kept.get("seed", DEFAULT_SEED)


DIFFERENT_TOKENIZERS = ("not paired: different tokenizers, and an evaluation written before blocks were cut by "
                        "characters (evaluate again to pair them); compare each run's own interval")


def block_bpc(kept: dict) -> float:
    """The bpc of one run's split from its kept blocks."""
    return sum(kept["nll"]) / sum(characters(kept)) / math.log(2)


def _across_tokenizers(kept: list[dict]) -> str | None:
    """Why blocks of runs of different tokenizers cannot be paired, or None: each cut by characters
    (minigpt.evaluate.intervals.character_blocks) into as many blocks of the same clean text."""
    if not all(k.get("cut") == "characters" and k.get("text_sha256") for k in kept):
        return DIFFERENT_TOKENIZERS
    if len({k["text_sha256"] for k in kept}) > 1:
        return "not comparable: the runs scored different text (the clean split's SHA-256 differs)"
    if len({len(k["nll"]) for k in kept}) > 1:
        return "not comparable: the runs cut the split into different blocks (evaluate.blocks differs)"
    return None


def unpairable(runs: list[RunFiles], kept: list[dict]) -> str | None:
    """Why the runs' kept blocks of one split cannot be resampled together (other text, other blocks, another
    tokenizer's blocks from before the character cut), or None when they can."""
    if len({(run.eval_blocks or {}).get("tokenizer") for run in runs}) > 1:
        return _across_tokenizers(kept)
    if len({k.get("sha256") for k in kept}) > 1:
        return "not comparable: the runs scored different text (the split's SHA-256 differs)"
    if len({(tuple(k.get("tokens") or ()), tuple(characters(k))) for k in kept}) > 1:
        return "not comparable: the runs cut the split into different blocks (evaluate.blocks differs)"
    return None


def paired_split(a: RunFiles, b: RunFiles, split: str) -> dict:
    """{"a", "b", "difference", "ci95", "verdict"} for one split, or {"verdict": why it cannot be compared}.
    Runs of two tokenizers are paired over their character blocks, each divided by its own characters."""
    blocks = [(run.eval_blocks or {}).get("splits", {}).get(split) for run in (a, b)]
    missing = [run.name for run, kept in zip((a, b), blocks) if not kept]
    if missing:
        return {"verdict": f"not comparable: no reports/eval_blocks.json for {', '.join(missing)} (evaluate again)"}
    bpc = [block_bpc(kept) for kept in blocks]
    why = unpairable([a, b], blocks)
    if why == DIFFERENT_TOKENIZERS:  # each run's own figure still means the same: bits per character
        return {"a": bpc[0], "b": bpc[1], "verdict": why}
    if why:
        return {"verdict": why}
    first, second = blocks
    paired = paired_difference(first["nll"], second["nll"], characters(first), *resampling(a),
                               chars_b=own_characters(first, second))
    return {"a": bpc[0], "b": bpc[1], **paired, "verdict": verdict_of(paired["ci95"])}


def own_characters(first: dict, other: dict) -> list[int] | None:
    """`other`'s characters per block where they differ from `first`'s (another tokenizer), else None."""
    return None if characters(other) == characters(first) else characters(other)


def verdict_of(ci95: list[float]) -> str:
    """What a 95% interval of B - A says: better (all of it below 0), worse (all above), or neither."""
    low, high = ci95
    return "B is better" if high < 0 else "B is worse" if low > 0 else "no detectable difference"


def difference_line(label: str, row: dict) -> str:
    """One terminal line of a comparison: A, B, B - A [95% interval] and the verdict, or why it was not compared."""
    if "difference" not in row and "a" in row:
        return f"{label} {row['a']:>8.4f} {row['b']:>8.4f} {row['b'] - row['a']:>+9.4f}  {'':<21} {row['verdict']}"
    if "difference" not in row:
        return f"{label} {row['verdict']}"
    low, high = row["ci95"]
    return (f"{label} {row['a']:>8.4f} {row['b']:>8.4f} {row['difference']:>+9.4f}  [{low:+.4f}, {high:+.4f}]  "
            f"{row['verdict']}")
