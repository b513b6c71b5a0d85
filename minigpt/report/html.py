"""The few HTML pieces the run report and the comparison page are made of: one self-contained page (inline
CSS, inline SVG, no script, no external resource), tables, and escaping of everything that comes from a run."""

from __future__ import annotations

import math
from html import escape

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1100px;
       color: #1a1a1a; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; } th, td { border: 1px solid #ddd; padding: 3px 8px;
  text-align: left; vertical-align: top; } th { background: #f4f4f4; } td.num { text-align: right;
  font-variant-numeric: tabular-nums; }
.passed { color: #05733c; font-weight: 600; } .failed { color: #b00020; font-weight: 700; }
.skipped { color: #8a6d00; } tr.failed-row td { background: #fdecee; } .best { background: #e3f4e8; font-weight: 700; }
.banner { padding: 8px 12px; border-radius: 4px; margin: 12px 0; } .banner.failed { background: #fdecee; }
.banner.passed { background: #e3f4e8; } tr.model-row td { background: #eef3fb; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; } .chart { border: 1px solid #eee; background: #fff; }
pre { background: #f7f7f7; padding: 8px; white-space: pre-wrap; word-break: break-word; }
code { font-size: 12px; } .muted { color: #666; } details { margin: 4px 0; }
"""


def page(title: str, body: list[str]) -> str:
    """A whole HTML document that opens from disk: no request leaves the page (a strict CSP says so too)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta "
            "http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src "
            f"data:\"><title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def fmt(value, digits: int = 4) -> str:
    """A cell's text: numbers rounded, None as a dash, everything escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return escape(str(value))
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def table(headers: list[str], rows: list[list[str]], row_classes: list[str] | None = None, cls: str = "") -> str:
    """Rows of already-escaped cell HTML; a cell given as ("num", html) is right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    lines = []
    for i, row in enumerate(rows):
        cells = "".join(f'<td class="{c[0]}">{c[1]}</td>' if isinstance(c, tuple) else f"<td>{c}</td>" for c in row)
        row_class = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        lines.append(f"<tr{row_class}>{cells}</tr>")
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>' + "".join(lines) + "</tbody></table>"
