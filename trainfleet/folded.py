"""Reports that read at a few hundred nodes: a node x property grid only where it fits the
terminal; otherwise each property with a finding, its values and the folded node set that has
each (``gpu[017,131]: 550.90.07 *``). Width is bounded and the length grows with the findings,
not the nodes. Plain functions over printable text (the caller escapes what nodes wrote)."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence

from trainfleet.node_sets import fold

WIDTH = 160  # columns of a report line, unless the caller asks for the wide grid
CELL = 48  # the longest value a grid cell holds; a longer one is a numbered note below the grid
GROUPS = 6  # values shown per property; the rest are counted on one line
ODD = " *"  # marks a value a finding is on


def wrapped(text: str, width: int = WIDTH, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` columns, the continuation indented four more."""
    return textwrap.wrap(
        text,
        width,
        initial_indent=indent,
        subsequent_indent=indent + "    ",
        break_long_words=True,
        break_on_hyphens=False,
    ) or [indent]


def grid(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns, two spaces apart, under a ruled header (``rows[0]``)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)).rstrip()

    return [line(rows[0]), line(["-" * w for w in widths]), *map(line, rows[1:])]


def noted(rows: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """The body's cells longer than ``CELL`` replaced by ``[n]``, and the notes that hold them
    (one note per distinct text), so a long explanation never widens every row."""
    notes: dict[str, int] = {}
    out = []
    for row in rows:
        cells = [row[0]]
        for cell in row[1:]:
            if len(cell) > CELL:
                mark = ODD if cell.endswith(ODD) else ""
                text = cell[: -len(ODD)] if mark else cell
                cell = f"[{notes.setdefault(text, len(notes) + 1)}]{mark}"
            cells.append(cell)
        out.append(cells)
    lines = [line for text, n in notes.items() for line in wrapped(f"[{n}] {text}")]
    return out, lines


def property_lines(
    prop: str, values: Mapping[str, str], odd: set[str], width: int = WIDTH
) -> list[str]:
    """One property: each value with the folded set of nodes that has it, the values a finding
    is on first (marked), then the others by how many nodes have them; past ``GROUPS`` values,
    the rest are counted on one line."""
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    ranked = sorted(
        groups.items(),
        key=lambda item: (0, len(item[1])) if odd.intersection(item[1]) else (1, -len(item[1])),
    )
    lines = [prop + ":"]
    for value, nodes in ranked[:GROUPS]:
        mark = ODD if odd.intersection(nodes) else ""
        lines += wrapped(f"{fold(nodes)}: {value}{mark}", width, "  ")
    rest = ranked[GROUPS:]
    if rest:
        nodes = [node for _, members in rest for node in members]
        lines += wrapped(f"{len(rest)} more values on {fold(nodes)}", width, "  ")
    return lines


def grouped(
    pairs: Iterable[tuple[str, str]], width: int = WIDTH, indent: str | None = None
) -> list[str]:
    """``(node, text)`` pairs as one line per text, ``[folded nodes] text`` (or, given
    ``indent``, ``<indent>folded nodes: text``), in first-seen order: the same finding on 200
    nodes is one line."""
    nodes: dict[str, list[str]] = {}
    for node, text in pairs:
        nodes.setdefault(text, []).append(node)
    return [
        line
        for text, names in nodes.items()
        for line in wrapped(
            f"[{fold(names)}] {text}" if indent is None else f"{indent}{fold(names)}: {text}", width
        )
    ]


def summary(nodes: Sequence[str], odd: Iterable[str]) -> str:
    """``256 nodes, 2 odd: gpu[017,131]``."""
    odd = set(odd)
    named = [n for n in nodes if n in odd]
    return f"{len(nodes)} nodes, {len(named)} odd" + (f": {fold(named)}" if named else "")
