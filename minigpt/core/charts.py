"""Line charts, drawn by matplotlib: one path for the PNG curves training writes (reports/train_curves.png) and
the inline SVG charts of the offline pages (no JavaScript, no network, text drawn as paths, so no font is
needed either).

A chart is a few series of (x, y) points on shared axes (each optionally with a shaded band, e.g. the range over a
group's seeds), a legend, and an optional log scale on y. Non-finite
points (and, on a log scale, points <= 0) are skipped, so a run that diverged shows where it stopped.
"""

from __future__ import annotations

import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure  # the object API: no pyplot state, no GUI backend
from matplotlib.ticker import FuncFormatter, NullFormatter

# colours that stay distinguishable for the common forms of colour blindness (Okabe-Ito)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
SVG_SIZE = (5.2, 2.8)  # inches at 100 dpi: 520 x 280 px on the page
SVG_STYLE = {"svg.fonttype": "path", "svg.hashsalt": "minigpt", "font.size": 8}


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    markers: bool = False  # dots on each point (sparse series, e.g. validation loss)
    dashed: bool = False
    band: list[tuple[float, float, float]] | None = None  # (x, low, high): a shaded range around the line


def drawable(series: list[Series], log_y: bool = False) -> list[Series]:
    """The series with only the points a chart can place."""
    def usable(x: float, y: float) -> bool:
        return math.isfinite(x) and math.isfinite(y) and (y > 0 or not log_y)

    def band(points):
        return None if points is None else [(x, low, high) for x, low, high in points
                                            if usable(x, low) and usable(x, high)]

    return [Series(s.label, [(x, y) for x, y in s.points if usable(x, y)], s.markers, s.dashed, band(s.band))
            for s in series]


def draw(ax, title: str, series: list[Series], x_label: str, y_label: str, log_y: bool = False) -> None:
    """The chart on a matplotlib Axes; with no drawable point it says "no data"."""
    ax.set_title(title, loc="left", fontsize=9, fontweight="bold")
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.grid(True, color="#eeeeee", linewidth=0.6)
    clean = drawable(series, log_y)
    if not any(s.points for s in clean):
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#999999")
        return
    for i, s in enumerate(clean):
        if not s.points:
            continue
        xs, ys = zip(*s.points)
        if s.band:
            band_x, lows, highs = zip(*s.band)
            ax.fill_between(band_x, lows, highs, color=PALETTE[i % len(PALETTE)], alpha=0.2, linewidth=0)
        ax.plot(xs, ys, color=PALETTE[i % len(PALETTE)], linewidth=1.2, linestyle="--" if s.dashed else "-",
                marker="o" if s.markers else None, markersize=3, label=s.label)
    if log_y:
        ax.set_yscale("log")
        plain = FuncFormatter(lambda value, _pos: f"{value:g}")  # 0.6, 2, 3 rather than 6 x 10^-1
        ax.yaxis.set_major_formatter(plain)
        ys = [y for s in clean for _, y in s.points]
        # within about a decade the powers of ten alone leave the axis unlabelled; over more, minor labels overlap
        ax.yaxis.set_minor_formatter(plain if max(ys) / min(ys) < 30 else NullFormatter())
    ax.legend(loc="upper right", fontsize=7, frameon=False)


def line_chart(title: str, series: list[Series], x_label: str, y_label: str, log_y: bool = False) -> str:
    """An inline <svg class="chart"> element (a string) for an HTML page."""
    with matplotlib.rc_context(SVG_STYLE):
        fig = Figure(figsize=SVG_SIZE, dpi=100)
        draw(fig.subplots(), title, series, x_label, y_label, log_y)
        fig.tight_layout()
        out = io.StringIO()
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    svg = out.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML declaration and DOCTYPE: the element goes inside HTML
    return re.sub(r"^<svg ", '<svg class="chart" role="img" ', svg, count=1)


def save_png(path: Path, charts: list[tuple[str, list[Series], str, str]], shared_x: bool = True) -> None:
    """Charts (title, series, x label, y label) stacked in one PNG, written atomically."""
    fig = Figure(figsize=(8, 3 * len(charts)))
    axes = fig.subplots(len(charts), 1, sharex=shared_x, squeeze=False)
    for ax, (title, series, x_label, y_label) in zip(axes[:, 0], charts):
        draw(ax, title, series, x_label, y_label)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, path)
