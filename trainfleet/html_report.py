"""A check's report as one self-contained HTML page, written beside its JSON: no network, no
script, inline CSS only. The summary, each finding with its folded nodes, and the node x check
grid (odd cells marked; the odd nodes first, so they are on the first screen at 256 nodes).
The preflight adds its bandwidth pairs as a heatmap (each pair's figure as a fraction of the
median). Every text a node could have written is escaped (``html.escape``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from trainfleet.compare import Report
from trainfleet.node_sets import fold

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
.summary{font-size:1.2em;font-weight:600}
.bad{color:#b00020}.good{color:#1b5e20}
table.grid{border-collapse:collapse;font-size:12px}
table.grid th,table.grid td{border:1px solid #ccc;padding:2px 4px;max-width:14em;
 overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
table.grid th.check{writing-mode:vertical-rl;transform:rotate(180deg);max-height:14em}
td.ok{background:#e8f5e9}td.odd{background:#d50000;color:#fff;font-weight:600}
td.none{background:#eee}
ul.findings li{margin:.3em 0}
.node{font-family:ui-monospace,monospace}
table.heat td{width:10px;height:10px;padding:0;border:0}
"""


def _cell(value: str | None, odd: bool) -> str:
    if value is None:
        return '<td class="none">?</td>'
    return f'<td class="{"odd" if odd else "ok"}" title="{escape(value)}">{escape(value)}</td>'


def grid(report: Report) -> str:
    """The node x check table: one row per node, one column per property; odd nodes first."""
    odd = {(f.node, f.property) for f in report.findings}
    odd_nodes = [n for n in report.nodes if any(o[0] == n for o in odd)]
    nodes = odd_nodes + [n for n in report.nodes if n not in odd_nodes]
    checks = list(dict.fromkeys(p for values in report.observed.values() for p in values))
    checks.sort(key=lambda p: not any(o[1] == p for o in odd))  # the checks with findings first
    head = "".join(f'<th class="check">{escape(c)}</th>' for c in checks)
    rows = []
    for node in nodes:
        values = report.observed.get(node)
        cells = (
            "".join(_cell(values.get(c), (node, c) in odd) for c in checks)
            if values is not None
            else f'<td class="odd" colspan="{max(len(checks), 1)}">cannot be read</td>'
        )
        rows.append(f'<tr><th class="node">{escape(node)}</th>{cells}</tr>')
    return f'<table class="grid"><tr><th>node</th>{head}</tr>{"".join(rows)}</table>'


def findings(report: Report) -> str:
    """Each finding once, with the folded set of nodes it is on."""
    on: dict[str, list[str]] = {}
    for f in report.findings:
        text = f"cannot be read ({f.observed})" if f.kind == "unreachable" else str(f)
        on.setdefault(text, []).append(f.node)
    items = "".join(
        f'<li><span class="node">{escape(fold(nodes))}</span>: {escape(text)}</li>'
        for text, nodes in on.items()
    )
    return f'<ul class="findings">{items}</ul>' if items else '<p class="good">no finding</p>'


def heatmap(nodes: Sequence[str], fraction: Mapping[tuple[str, str], float]) -> str:
    """Node pairs as a heatmap: each cell the pair's bus bandwidth as a fraction of the median
    (red below half, white at the median); a pair not measured is grey."""
    rows = []
    for a in nodes:
        cells = []
        for b in nodes:
            value = fraction.get((a, b), fraction.get((b, a)))
            if value is None:
                cells.append('<td style="background:#eee"></td>')
                continue
            shade = max(0, min(255, int(255 * min(value, 1.0))))
            cells.append(
                f'<td style="background:rgb(255,{shade},{shade})" '
                f'title="{escape(a)} - {escape(b)}: {value:.2f} of the median"></td>'
            )
        rows.append(f'<tr><th class="node">{escape(a)}</th>{"".join(cells)}</tr>')
    return f'<table class="heat">{"".join(rows)}</table>'


def page(report: Report, title: str, extra: str = "") -> str:
    """The whole page: summary, findings, the preflight's ``extra`` (its heatmap), the grid."""
    odd = sorted({f.node for f in report.findings}, key=report.nodes.index)
    summary = (
        f'<p class="summary bad">{len(report.nodes)} nodes, {len(odd)} odd: {escape(fold(odd))}</p>'
        if odd
        else f'<p class="summary good">{len(report.nodes)} nodes match '
        f"{escape(report.compared_with)}</p>"
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>{escape(title)}</h1>{summary}<h2>Findings</h2>{findings(report)}{extra}"
        f"<h2>Nodes and checks</h2>{grid(report)}</body></html>\n"
    )
