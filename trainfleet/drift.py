"""Drift: compare what nodes are against the spec, against each other, and for uniqueness.

Plain Python over plain data (property -> value per node), testable without any host.
Values are normalised strings, so equal means equal.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

# Properties every node must share (majority vote names the odd node) ...
PYTHON_PREFIX = "python "  # one property per package in the node venv: "python deepspeed"
IDENTICAL_PREFIXES = ("os", "kernel", "gpu driver", "cuda", "cudnn", "nccl", "torch", "gcc", "package ", PYTHON_PREFIX,
                      "hosts block", "known_hosts block", "authorized_keys", "pdsh nodes",
                      # GPU node settings every node shares (GPU-only ones are the spec's to expect)
                      "memlock", "cluster MTU", "ib ports active", "ib active MTU", "clock sync", "clock offset",
                      "persistence mode")
# ... and properties no two nodes may share.
UNIQUE = ("hostname", "boot_id", "machine-id")
ABSENT = "absent"
UNREACHABLE = "unreachable"


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
    kind: str  # spec | majority | tie | unique | unreachable
    observed: str
    expected: str | None = None

    def __str__(self) -> str:
        if self.kind == "unreachable":
            return f"{self.node}: cannot be read ({self.observed})"
        if self.kind == "unique":
            return f"{self.property} {self.observed!r} is not unique ({self.expected})"
        if self.kind == "tie":
            return f"{self.property}: no majority ({self.expected})"
        if self.kind == "majority":
            return f"{self.property} is {self.observed!r}, the other nodes have {self.expected!r}"
        return f"{self.property} is {self.observed!r}, the spec wants {self.expected!r}"


@dataclass
class Report:
    cluster: str
    nodes: list[str]
    observed: dict[str, dict[str, str]]  # node -> property -> value (reachable nodes only)
    findings: list[Finding] = field(default_factory=list)
    mesh_probe: dict[str, Any] | None = None  # which peers the live SSH probe reached (checks/drift.py)

    @property
    def drift(self) -> bool:
        return bool(self.findings)

    def findings_for(self, node: str) -> list[Finding]:
        return [f for f in self.findings if f.node == node]

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "drift": self.drift,
            "nodes": {n: {"reachable": n in self.observed, "properties": self.observed.get(n, {})}
                      for n in self.nodes},
            "findings": [asdict(f) for f in self.findings],
            **({"mesh_probe": self.mesh_probe} if self.mesh_probe else {}),
        }

    def table(self, all_rows: bool = False) -> str:
        """Properties by nodes; only rows with a finding unless ``all_rows``; odd values marked '*'."""
        odd = {(f.node, f.property) for f in self.findings}
        properties = list(dict.fromkeys(p for values in self.observed.values() for p in values))
        rows = [p for p in properties if all_rows or any((n, p) in odd for n in self.nodes)]
        unreachable = [f.node for f in self.findings if f.kind == "unreachable"]
        if unreachable:
            rows = ["reachable", *rows]
        header = ["property", *self.nodes]
        body = []
        for prop in rows:
            cells = [prop]
            for node in self.nodes:
                if prop == "reachable":
                    cells.append("NO *" if node in unreachable else "yes")
                    continue
                value = self.observed.get(node, {}).get(prop, "-" if node in self.observed else "?")
                cells.append(f"{value} *" if (node, prop) in odd else value)
            body.append(cells)
        if not body:
            return f"no drift: {len(self.nodes)} nodes match the spec and each other"
        widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
        line = lambda row: "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
        return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, body)])

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)


def absent_everywhere_else(observed: dict[str, dict[str, str]], prefix: str) -> None:
    """Properties under ``prefix`` that some node has and another lacks (a package in one
    node's venv only) become ABSENT on the others, so the majority vote can name the odd node."""
    seen = {p for props in observed.values() for p in props if p.startswith(prefix)}
    for props in observed.values():
        props.update({p: ABSENT for p in sorted(seen) if p not in props})


def compare(cluster: str, nodes: list[str], observed: dict[str, dict[str, str]],
            expected: dict[str, dict[str, str]], unreachable: dict[str, str] | None = None) -> Report:
    """Findings of (a) each node against the spec, (b) nodes against each other for
    properties that must be identical, (c) properties that must be unique."""
    report = Report(cluster=cluster, nodes=list(nodes), observed=observed)
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
        if prop in UNIQUE:
            report.findings += _duplicates(prop, values)
        elif prop.startswith(IDENTICAL_PREFIXES):
            report.findings += [f for f in majority(prop, values) if (f.node, f.property) not in spec_findings]
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
    return [Finding(node, prop, "majority", value, top) for node, value in values.items() if value != top]


def _duplicates(prop: str, values: dict[str, str]) -> list[Finding]:
    owners: dict[str, list[str]] = {}
    for node, value in values.items():
        owners.setdefault(value, []).append(node)
    return [Finding(node, prop, "unique", value, "also on " + ", ".join(n for n in shared if n != node))
            for value, shared in owners.items() if len(shared) > 1 and value != ABSENT for node in shared]
