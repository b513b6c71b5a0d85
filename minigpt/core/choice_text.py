"""How a recorded choice reads in one line (the console and the run page say the same). Without torch: the report
stage, which only reads records, does not import it."""

from __future__ import annotations


def number_text(value, spec: str = ",.0f") -> str:
    """A recorded number for a one-line description; a field missing from an old report reads "?"."""
    return format(value, spec) if isinstance(value, (int, float)) else "?"


def how_chosen(record: dict) -> str:
    """How a precision record's choice was made, in words (the console and the run page say the same): as
    configured; or auto, with both timings measured on this machine, or why bf16 could not run."""
    if "fp32_tokens_per_s" in record:
        return (f"auto: fp32 {number_text(record.get('fp32_tokens_per_s'))} and bf16 "
                f"{number_text(record.get('bf16_tokens_per_s'))} tokens/s timed on this machine, batch "
                f"{record.get('batch')}, {number_text(record.get('seconds'), '.1f')} s")
    if record.get("configured") == "auto":
        return f"auto: {record.get('reason', '')}"
    return "as configured"
