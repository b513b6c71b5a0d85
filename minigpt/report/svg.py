"""Line charts as inline SVG: no JavaScript, no network, readable from a file on disk.

A chart is a few series of (x, y) points drawn on shared axes with "nice" ticks, a legend, and optional log
scale on y. Non-finite values are skipped (a run that diverged shows where it stopped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

# colours that stay distinguishable for the common forms of colour blindness (Okabe-Ito)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
WIDTH, HEIGHT = 520, 280
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 16, 28, 44


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    markers: bool = False  # dots on each point (sparse series, e.g. validation loss)
    dashed: bool = False


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values covering [low, high] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(1, count)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def log_ticks(low: float, high: float) -> list[float]:
    """Round values (1, 2 and 5 times a power of ten) between 10**low and 10**high, as log10 positions."""
    ticks = []
    for power in range(math.floor(low), math.ceil(high) + 1):
        for mantissa in (1, 2, 5):
            position = math.log10(mantissa) + power
            if low <= position <= high:
                ticks.append(position)
    return ticks if len(ticks) >= 2 else nice_ticks(low, high)


def _format(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4:
        return f"{value / 1000:g}k"
    if abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"


def line_chart(title: str, series: list[Series], x_label: str, y_label: str, log_y: bool = False) -> str:
    """An <svg> element (a string) with one line per series; an empty chart says there is no data."""
    def usable(x: float, y: float) -> bool:
        return math.isfinite(x) and math.isfinite(y) and (y > 0 or not log_y)

    clean = [Series(s.label, [(x, y) for x, y in s.points if usable(x, y)], s.markers, s.dashed) for s in series]
    points = [p for s in clean for p in s.points]
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" '
            f'width="{WIDTH}" height="{HEIGHT}"><title>{escape(title)}</title>'
            f'<text x="{MARGIN_LEFT}" y="18" class="chart-title">{escape(title)}</text>')
    if not points:
        return head + f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" class="empty">no data</text></svg>'
    scale_y = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    xs, ys = [p[0] for p in points], [scale_y(p[1]) for p in points]
    x_low, x_high = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y_low, y_high = min(ys), max(ys)
    pad = (y_high - y_low) * 0.05 or 0.5
    y_low, y_high = y_low - pad, y_high + pad
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def px(x: float) -> float:
        return MARGIN_LEFT + (x - x_low) / (x_high - x_low) * plot_w

    def py(y: float) -> float:
        return MARGIN_TOP + (1 - (scale_y(y) - y_low) / (y_high - y_low)) * plot_h

    parts = [head, f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{plot_w}" height="{plot_h}" class="plot-area"/>']
    for tick in nice_ticks(x_low, x_high):
        if x_low <= tick <= x_high:
            parts.append(f'<line x1="{px(tick):.1f}" x2="{px(tick):.1f}" y1="{MARGIN_TOP}" y2="{MARGIN_TOP + plot_h}" class="grid"/>'
                         f'<text x="{px(tick):.1f}" y="{MARGIN_TOP + plot_h + 16}" text-anchor="middle" class="tick">{_format(tick)}</text>')
    for tick in log_ticks(y_low, y_high) if log_y else nice_ticks(y_low, y_high):
        value = 10 ** tick if log_y else tick
        if y_low <= tick <= y_high:
            parts.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{py(value):.1f}" y2="{py(value):.1f}" class="grid"/>'
                         f'<text x="{MARGIN_LEFT - 6}" y="{py(value) + 4:.1f}" text-anchor="end" class="tick">{_format(value)}</text>')
    parts.append(f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" class="axis-label">{escape(x_label)}</text>'
                 f'<text x="14" y="{MARGIN_TOP + plot_h / 2}" text-anchor="middle" class="axis-label" '
                 f'transform="rotate(-90 14 {MARGIN_TOP + plot_h / 2})">{escape(y_label)}{" (log)" if log_y else ""}</text>')
    for i, s in enumerate(clean):
        colour = PALETTE[i % len(PALETTE)]
        if s.points:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            dash = ' stroke-dasharray="5 3"' if s.dashed else ""
            parts.append(f'<polyline class="series" fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{path}"/>')
            if s.markers:
                parts.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>' for x, y in s.points)
        legend_y = MARGIN_TOP + 14 + 16 * i
        parts.append(f'<rect x="{MARGIN_LEFT + plot_w - 180}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{MARGIN_LEFT + plot_w - 165}" y="{legend_y}" class="legend">{escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)
