"""Drift: compare what nodes are against the spec, against each other, and for uniqueness.

Plain Python over plain data (property -> value per node), testable without any host.
Values are normalised strings, so equal means equal.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from trainfleet import folded
from trainfleet.folded import WIDTH
from trainfleet.node_sets import fold

PYTHON_PREFIX = "python "  # one property per package in the node venv: "python deepspeed"
ABSENT = "absent"
HEALTHY = "none"  # a health gate's value on a node that passes it: nothing found
DIFF_LINES = 40  # a finding's diff, at most (a whole rewritten file is named, not printed)
DIFF_WIDTH = 160  # characters of one diff line


def digest(lines: list[str] | str | None) -> str:
    """A short, stable digest of a block or file ('absent' for none)."""
    if lines is None:
        return ABSENT
    text = lines if isinstance(lines, str) else "\n".join(lines)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Finding:
    node: str
    property: str
    kind: str  # spec | majority | tie | unique | health | changed | unreachable
    observed: str
    expected: str | None = None
    files: tuple[str, ...] = ()  # the managed files that differ (a spec finding on content)
    diff: tuple[str, ...] = ()  # their unified diff, expected vs found (never key material)

    def __str__(self) -> str:
        if self.kind == "unreachable":
            return f"{self.node}: cannot be read ({self.observed})"
        if self.kind == "unique":
            return f"{self.property} {self.observed!r} is not unique ({self.expected})"
        if self.kind in ("health", "changed"):
            return f"{self.property}: {self.observed}"
        if self.kind == "tie":
            return f"{self.property}: no majority ({self.expected})"
        if self.kind == "majority":
            return f"{self.property} is {self.observed!r}, the other nodes have {self.expected!r}"
        if self.files:
            verb = "differs" if len(self.files) == 1 else "differ"
            return (
                f"{self.property}: {', '.join(self.files)} {verb} from the spec "
                f"({self.observed!r}, the spec wants {self.expected!r})"
            )
        return f"{self.property} is {self.observed!r}, the spec wants {self.expected!r}"

    def to_json(self) -> dict[str, Any]:
        found = asdict(self)
        for key in ("files", "diff"):  # only where there is a content diff
            found[key] = list(found[key])
            if not found[key]:
                del found[key]
        return found


@dataclass
class Report:
    cluster: str
    nodes: list[str]
    observed: dict[str, dict[str, str]]  # node -> property -> value (reachable nodes only)
    findings: list[Finding] = field(default_factory=list)
    mesh_probe: dict[str, Any] | None = (
        None  # which peers the live SSH probe reached (checks/drift_check.py)
    )
    # what "no drift" means: what the nodes were compared with (the offline judge without a
    # spec compares them with each other only)
    compared_with: str = "the spec and each other"
    # the deploy's steps the spec's ``manage`` turned off: observed, never compared with the spec
    not_managed: tuple[str, ...] = ()
    # what a deploy would change (``deploy_changes``): step -> node -> one line per property
    would_change: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    @property
    def drift(self) -> bool:
        return bool(self.findings)

    def findings_for(self, node: str) -> list[Finding]:
        return [f for f in self.findings if f.node == node]

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "drift": self.drift,
            "nodes": {
                n: {"reachable": n in self.observed, "properties": self.observed.get(n, {})}
                for n in self.nodes
            },
            "findings": [f.to_json() for f in self.findings],
            **({"mesh_probe": self.mesh_probe} if self.mesh_probe else {}),
            **({"not_managed": list(self.not_managed)} if self.not_managed else {}),
            **({"would_change": self.would_change} if self.would_change else {}),
        }

    def change_lines(self) -> list[str]:
        """For people: the steps not managed, then what a deploy would change, step by step,
        each line with the folded nodes it is on (one line for a whole rack alike)."""
        lines = []
        if self.not_managed:
            lines.append(
                f"not managed (the spec's manage:): {', '.join(self.not_managed)}: "
                "observed, not compared with the spec"
            )
        if self.would_change:
            lines.append("a deploy would change:")
        for step, nodes in self.would_change.items():
            lines += folded.grouped(
                ((node, printable(text)) for node, changes in nodes.items() for text in changes),
                indent=printable(f"  {step}: "),
            )
        return lines

    def table(self, all_rows: bool = False, wide: bool = False, width: int = WIDTH) -> str:
        """Properties by nodes; rows with a finding only, unless ``all_rows``; odd values: '*'.
        The node x property grid where it fits ``width`` (or ``wide``), a value longer than a
        cell as a note below it; else each row's values with the folded node set that has each
        (trainfleet/folded.py). A summary line first where there are findings."""
        cells = self._cells(all_rows)
        if not cells and self.findings:  # on properties no node shows
            return "\n".join(
                [folded.summary(self.nodes, (f.node for f in self.findings)), *self._found(width)]
            )
        if not cells:
            return f"no drift: {len(self.nodes)} nodes match {self.compared_with}"
        head = [folded.summary(self.nodes, (f.node for f in self.findings))]
        lines, notes = self._grid(cells)
        if wide or max(map(len, [*lines, *notes])) <= width:
            return "\n".join([*head, *lines, *notes, *self._diffs()])
        for prop, values in cells.items():
            marked = {n for n, v in values.items() if v.endswith(folded.ODD)}
            plain = {n: v.removesuffix(folded.ODD) for n, v in values.items()}
            head += folded.property_lines(prop, plain, marked, width)
        return "\n".join([*head, *self._diffs(by_nodes=True)])

    def _cells(self, all_rows: bool) -> dict[str, dict[str, str]]:
        """The rows shown (those with a finding, unless ``all_rows``): property -> node -> cell."""
        odd = {(f.node, f.property) for f in self.findings}
        properties = list(dict.fromkeys(p for values in self.observed.values() for p in values))
        rows = [p for p in properties if all_rows or any((n, p) in odd for n in self.nodes)]
        unreachable = [f.node for f in self.findings if f.kind == "unreachable"]
        if unreachable:
            rows = ["reachable", *rows]
        return {prop: self._row(prop, odd, unreachable) for prop in rows}

    def _grid(self, cells: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
        body, notes = folded.noted([[prop, *values.values()] for prop, values in cells.items()])
        return folded.grid([["property", *self.nodes], *body]), notes

    def _row(self, prop: str, odd: set[tuple[str, str]], unreachable: list[str]) -> dict[str, str]:
        """Each node's printable cell of one row, a value a finding is on marked."""
        cells = {}
        for node in self.nodes:
            if prop == "reachable":
                cells[node] = "NO *" if node in unreachable else "yes"
                continue
            value = self.observed.get(node, {}).get(prop, "-" if node in self.observed else "?")
            cells[node] = printable(f"{value} *" if (node, prop) in odd else value)
        return cells

    def folds(self, wide: bool = False, width: int = WIDTH) -> bool:
        """Whether ``table`` folds (the grid does not fit): then ``finding_lines`` folds too."""
        cells = self._cells(all_rows=False)
        if wide or not cells:
            return not wide and bool(self.findings) and not cells
        lines, notes = self._grid(cells)
        return max(map(len, [*lines, *notes])) > width

    def finding_lines(self, wide: bool = False, width: int = WIDTH) -> list[str]:
        """One line per finding, ``[node] finding``, beside the grid; where the table folds, one
        line per finding text with the folded nodes it is on, wrapped to ``width``."""
        if not self.folds(wide, width):
            return [printable(f"[{f.node}] {f}") for f in self.findings]
        return self._found(width)

    def _found(self, width: int) -> list[str]:
        return folded.grouped(
            (
                (f.node, printable(f"cannot be read ({f.observed})"))
                if f.kind == "unreachable"
                else (f.node, printable(str(f)))
                for f in self.findings
            ),
            width,
        )

    def _diffs(self, by_nodes: bool = False) -> list[str]:
        """Below the table: each content finding's files and diff, one printable line each;
        folded: one entry per distinct diff, with the nodes that have it."""
        if by_nodes:
            seen: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
            for f in self.findings:
                if f.files:
                    seen.setdefault((f.property, f.files, f.diff), []).append(f.node)
            lines = []
            for (prop, files, diff), nodes in seen.items():
                lines += ["", printable(f"{fold(nodes)}: {prop}: {', '.join(files)}")]
                lines += [f"    {printable(line)}" for line in diff]
            return lines
        lines = []
        for f in self.findings:
            if f.files:
                lines += ["", printable(f"{f.node}: {f.property}: {', '.join(f.files)}")]
                lines += [f"    {printable(line)}" for line in f.diff]
        return lines

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)


def printable(text: str) -> str:
    """``text`` on one line as a terminal shows it: every control, format or undecodable
    character escaped (``\\n``, ``\\x1b``, ``\\u202e``, ``\\udcff``), so no content a node holds can
    end a row, forge one or move the cursor."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Content(NamedTuple):
    """One managed file or block as drift compares it: the sha256 of its bytes (``absent``:
    no such file or block) and its text, None where it must not be shown (key and
    certificate material) or was not read (a file the node sent by digest only)."""

    sha: str
    text: str | None


def content(text: str | list[str] | bytes | None, shown: bool = True) -> Content:
    """A file's text (a block: its lines) as a ``Content``; key material with ``shown=False``."""
    if text is None:
        return Content(ABSENT, None)
    if isinstance(text, list):
        text = "\n".join(text)
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogateescape")
    shown = shown and isinstance(text, str)
    return Content(
        hashlib.sha256(data).hexdigest(), text if isinstance(text, str) and shown else None
    )


def content_diff(
    wanted: dict[str, Content], found: dict[str, Content], limit: int = DIFF_LINES
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the files whose content differs, a unified diff of those that may be shown: expected
    vs found, at most ``limit`` lines of at most DIFF_WIDTH characters)."""
    missing = Content(ABSENT, None)
    files = tuple(
        name
        for name in sorted(wanted.keys() | found.keys())
        if wanted.get(name, missing).sha != found.get(name, missing).sha
    )
    lines: list[str] = []
    for name in files:
        want, have = (_diff_lines(side.get(name, missing)) for side in (wanted, found))
        if want is None or have is None:
            continue
        lines += difflib.unified_diff(
            want, have, f"{name} (expected)", f"{name} (found)", n=1, lineterm=""
        )
    if len(lines) > limit:
        lines = [*lines[: limit - 1], f"... {len(lines) - limit + 1} more lines of diff"]
    return files, tuple(_cut(line) for line in lines)


def _cut(line: str) -> str:
    return line if len(line) <= DIFF_WIDTH else f"{line[: DIFF_WIDTH - 3]}..."


def _diff_lines(side: Content) -> list[str] | None:
    if side.sha == ABSENT:
        return []
    return None if side.text is None else side.text.split("\n")


def explain(
    report: Report,
    wanted: dict[str, dict[str, dict[str, Content]]],
    found: dict[str, dict[str, dict[str, Content]]],
) -> None:
    """Give each spec finding on a managed file's digest the files that differ and their diff
    (``wanted``/``found``: node -> property -> file name -> Content)."""
    for i, f in enumerate(report.findings):
        want, have = wanted.get(f.node, {}).get(f.property), found.get(f.node, {}).get(f.property)
        if f.kind == "spec" and want is not None and have is not None:
            files, diff = content_diff(want, have)
            report.findings[i] = replace(f, files=files, diff=diff)


CHANGE_FILES = 3  # files named in a change's line; the rest counted
CHANGE_VALUE = 80  # characters of a value shown in a change's line


def change_text(finding: Finding) -> str:
    """What a deploy would do about one spec finding, in words: add, remove, rewrite files, or
    change a value from what the node has to what the spec wants (each shortened: a line)."""
    files = list(finding.files[:CHANGE_FILES])
    if len(finding.files) > CHANGE_FILES:
        files.append(f"{len(finding.files) - CHANGE_FILES} more")
    where = f" ({', '.join(files)})" if files else ""
    if finding.observed == ABSENT:
        return f"{finding.property}{where} would be added"
    if finding.expected == ABSENT:
        return f"{finding.property}{where} would be removed"
    if finding.files:
        return f"{finding.property}{where} would be rewritten"
    have, want = (_short(v) for v in (finding.observed, finding.expected or ""))
    return f"{finding.property} would change from {have!r} to {want!r}"


def _short(value: str) -> str:
    return value if len(value) <= CHANGE_VALUE else f"{value[: CHANGE_VALUE - 3]}..."


def deploy_changes(
    findings: list[Finding], steps: dict[str, dict[str, str | None]]
) -> dict[str, dict[str, list[str]]]:
    """The spec findings a deploy would mend, by the step that mends each (``steps``: node ->
    property -> its ``manage`` step, None where no step sets it) and node, in the steps' order
    of first appearance: step -> node -> what would change."""
    changes: dict[str, dict[str, list[str]]] = {}
    for f in findings:
        step = steps.get(f.node, {}).get(f.property) if f.kind == "spec" else None
        if step is not None:
            changes.setdefault(step, {}).setdefault(f.node, []).append(change_text(f))
    return changes


def absent_everywhere_else(observed: dict[str, dict[str, str]], prefix: str) -> None:
    """Properties under ``prefix`` that some node has and another lacks (a package in one
    node's venv only) become ABSENT on the others, so the majority vote can name the odd node."""
    seen = {p for props in observed.values() for p in props if p.startswith(prefix)}
    for props in observed.values():
        props.update({p: ABSENT for p in sorted(seen) if p not in props})


@dataclass(frozen=True)
class Rules:
    """What the comparison judges beyond the spec, by property: the prefixes every node must
    share (the majority vote names the odd node), the properties no two nodes may share, and
    the health gates' prefixes (the registry's ``trainfleet.capabilities.RULES``)."""

    majority: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()
    health: tuple[str, ...] = ()
    absent_elsewhere: tuple[str, ...] = ()  # absent_everywhere_else's prefixes


def compare(
    cluster: str,
    nodes: list[str],
    observed: dict[str, dict[str, str]],
    expected: dict[str, dict[str, str]],
    unreachable: dict[str, str] | None = None,
    *,
    rules: Rules,
) -> Report:
    """Findings of (a) each node against the spec, (b) nodes against each other for
    properties that must be identical, (c) properties that must be unique, (d) health gates
    (a node that reports one must report ``none``)."""
    report = Report(cluster=cluster, nodes=list(nodes), observed=observed)
    identical, unique, health = rules.majority, rules.unique, rules.health
    for node, reason in (unreachable or {}).items():
        report.findings.append(Finding(node, "reachable", "unreachable", reason))
    for node, props in expected.items():
        for prop, want in props.items():
            have = observed.get(node, {}).get(prop)
            if node in observed and have != want:
                report.findings.append(Finding(node, prop, "spec", have or ABSENT, want))
    spec_findings = {(f.node, f.property) for f in report.findings}
    properties = dict.fromkeys(p for values in observed.values() for p in values)
    for prop in properties:
        values = {node: props[prop] for node, props in observed.items() if prop in props}
        if prop in unique:
            report.findings += _duplicates(prop, values)
        elif prop.startswith(health):
            report.findings += [
                Finding(node, prop, "health", value, HEALTHY)
                for node, value in values.items()
                if value != HEALTHY and (node, prop) not in spec_findings
            ]
        elif prop.startswith(identical):
            report.findings += [
                f for f in majority(prop, values) if (f.node, f.property) not in spec_findings
            ]
    order = {n: i for i, n in enumerate(nodes)}
    report.findings.sort(key=lambda f: (order.get(f.node, len(order)), f.property))
    return report


def majority(prop: str, values: dict[str, str]) -> list[Finding]:
    """The nodes whose value differs from most nodes' (a tie: every node, kind ``tie``)."""
    counts = Counter(values.values())
    if len(counts) < 2:
        return []
    (top, top_count), (_, second_count) = counts.most_common(2)
    if top_count == second_count:
        summary = ", ".join(f"{v!r} on {c}" for v, c in counts.most_common())
        return [Finding(node, prop, "tie", value, summary) for node, value in values.items()]
    return [
        Finding(node, prop, "majority", value, top)
        for node, value in values.items()
        if value != top
    ]


def _duplicates(prop: str, values: dict[str, str]) -> list[Finding]:
    owners: dict[str, list[str]] = {}
    for node, value in values.items():
        owners.setdefault(value, []).append(node)
    return [
        Finding(node, prop, "unique", value, "also on " + ", ".join(n for n in shared if n != node))
        for value, shared in owners.items()
        if len(shared) > 1 and value != ABSENT
        for node in shared
    ]
