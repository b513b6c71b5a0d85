"""The run page's chain of custody: the pipeline graph (inline SVG, one arrow per producer -> consumer, coloured by
the worst status of its links) and the table of every link as the report stage verified it."""

from __future__ import annotations

from html import escape

from minigpt.report.html import table
from minigpt.report.run_files import RunFiles

# where each stage sits in the drawing: (column, row), in the order the data flows
NODES = {"fetch": (0, 1), "clean": (1, 1), "tokenizer": (2, 0), "encode": (3, 1), "baselines": (2, 2),
         "soft_targets": (4, 0), "preflight": (4, 2), "train": (5, 1), "evaluate": (6, 1), "generate": (6, 0),
         "report": (7, 1)}
COLOURS = {"ok": "#05733c", "broken": "#b00020", "not used": "#9a9a9a"}
WIDTH, HEIGHT, NODE_W, NODE_H = 1040, 260, 96, 30


def _centre(stage: str) -> tuple[float, float]:
    column, row = NODES[stage]
    return 20 + column * 130 + NODE_W / 2, 30 + row * 75 + NODE_H / 2


def _edge_status(links: list[dict]) -> str:
    statuses = {link["status"] for link in links}
    return "broken" if "broken" in statuses else "ok" if "ok" in statuses else "not used"


def graph_svg(chain: dict) -> str:
    edges: dict[tuple[str, str], list[dict]] = {}
    for link in chain["links"]:
        edges.setdefault((link["producer"], link["consumer"]), []).append(link)
    parts = [f'<svg class="custody-graph" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="pipeline chain of custody">',
             '<defs>' + "".join(
                 f'<marker id="arrow-{i}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
                 f'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
                 for i, colour in enumerate(COLOURS.values())) + '</defs>']
    marker = {status: f"arrow-{i}" for i, status in enumerate(COLOURS)}
    for (producer, consumer), links in edges.items():
        status = _edge_status(links)
        (x1, y1), (x2, y2) = _centre(producer), _centre(consumer)
        x1, x2 = x1 + NODE_W / 2, x2 - NODE_W / 2
        roles = ", ".join(link["role"] for link in links)
        dash = ' stroke-dasharray="4 3"' if status == "not used" else ""
        # an edge along a row that skips a column bows below the row, so it never runs through a node
        span = NODES[consumer][0] - NODES[producer][0]
        bow = 32 * (span - 1) if NODES[consumer][1] == NODES[producer][1] and span > 1 else 0
        third = (x2 - x1) / 3
        parts.append(f'<path class="edge {status.replace(" ", "-")}" d="M{x1:.0f},{y1:.0f} C{x1 + third:.0f},'
                     f'{y1 + bow:.0f} {x2 - third:.0f},{y2 + bow:.0f} {x2:.0f},{y2:.0f}" fill="none" '
                     f'stroke="{COLOURS[status]}" stroke-width="{3 if status == "broken" else 1.6}"'
                     f'{dash} marker-end="url(#{marker[status]})"><title>{escape(producer)} -&gt; '
                     f'{escape(consumer)}: {escape(roles)} ({status})</title></path>')
    broken_stages = {link["consumer"] for link in chain["links"] if link["status"] == "broken"}
    for stage, (column, row) in NODES.items():
        x, y = 20 + column * 130, 30 + row * 75
        stroke = COLOURS["broken"] if stage in broken_stages else "#555"
        parts.append(f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="5" fill="#f7f7f7" '
                     f'stroke="{stroke}"/><text x="{x + NODE_W / 2:.0f}" y="{y + 19}" text-anchor="middle" '
                     f'font-size="12" font-family="sans-serif">{escape(stage)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def custody_section(run: RunFiles) -> list[str]:
    chain = run.custody
    out = ["<h2>Chain of custody</h2>"]
    if not chain or not isinstance(chain.get("links"), list):
        return out + ['<p class="muted">not verified (the report stage verifies it when it writes this page)</p>']
    broken = [link for link in chain["links"] if link["status"] == "broken"]
    if broken:
        out.append(f'<div class="banner failed"><span class="failed">Chain of custody broken at '
                   f'{len(broken)} link(s)</span>: the decision metrics were not written. First: '
                   f'{escape(broken[0]["producer"])} -&gt; {escape(broken[0]["consumer"])} '
                   f'({escape(broken[0]["role"])}): {escape(broken[0]["problem"])}</div>')
    else:
        out.append('<p><span class="passed">Chain of custody intact</span>: every stage read what the stage before '
                   "it recorded writing, and used those values (recomputed from the files).</p>")
    out.append(graph_svg(chain))
    rows, classes = [], []
    for link in chain["links"]:
        status = link["status"]
        css = "passed" if status == "ok" else "failed" if status == "broken" else "muted"
        rows.append([escape(link["producer"]), escape(link["consumer"]), escape(link["role"]),
                     f"<code>{escape(link['artifact'])}</code>", f'<span class="{css}">{escape(status)}</span>',
                     escape(link.get("problem", ""))])
        classes.append("failed-row" if status == "broken" else "")
    out.append("<details" + (" open" if broken else "") + "><summary>every link</summary>" + table(
        ["producer", "consumer", "role", "artifact", "status", "problem"], rows, classes, cls="custody") +
               "</details>")
    return out
