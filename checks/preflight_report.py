"""The preflight's report: its problems, warnings, stage outcomes and details."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from trainfleet import folded
from trainfleet.compare import Finding, Report, printable
from trainfleet.folded import WIDTH


@dataclass(frozen=True)
class Problem:
    stage: str  # hygiene | reachability | ssh | collective | isolation | smoke | unreachable
    node: str
    cause: str

    def __str__(self) -> str:
        return f"{self.stage}: {self.cause}"


@dataclass
class PreflightReport:
    cluster: str
    nodes: list[str]
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(
        default_factory=list
    )  # shown, reported, but the cluster can train
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ok" | "failed" | "skipped"
    details: dict[str, Any] = field(default_factory=dict)
    healthy: dict[str, Any] = field(default_factory=dict)  # checks/healthy_subset.py
    # a staleness-bounded run: node -> when it passed (not tested again); node -> why tested
    carried: dict[str, str] = field(default_factory=dict)
    retested: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problems_for(self, node: str) -> list[Problem]:
        return [p for p in self.problems if p.node == node]

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "ok": self.ok,
            "stages": self.stages,
            "problems": [asdict(p) for p in self.problems],
            "warnings": [asdict(w) for w in self.warnings],
            "healthy": self.healthy,
            "carried": self.carried,
            "retested": self.retested,
            "details": self.details,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def cells(self) -> dict[str, dict[str, str]]:
        """stage -> node -> ok | FAIL | ok, warning | skipped | carried."""
        return {row[0]: dict(zip(self.nodes, row[1:], strict=True)) for row in self._rows()[1:]}

    def table(self, wide: bool = False, width: int = WIDTH) -> str:
        """Stages by nodes where the grid fits ``width`` (or ``wide``); else a summary line and
        each stage's outcomes with the folded node set that has each (trainfleet/folded.py)."""
        rows = self._rows()
        lines = folded.grid(rows)
        del lines[1]  # the preflight's grid has no rule under its header
        if wide or max(map(len, lines)) <= width:
            return "\n".join(lines)
        failing = {p.node for p in self.problems}
        out = [folded.summary(self.nodes, failing)]
        for stage, cells in self.cells().items():
            odd = {node for node, cell in cells.items() if cell == "FAIL"}
            out += folded.property_lines(stage, cells, odd, width)
        return "\n".join(out)

    def folds(self, wide: bool = False, width: int = WIDTH) -> bool:
        return not wide and max(map(len, folded.grid(self._rows()))) > width

    def problem_lines(self, wide: bool = False, width: int = WIDTH) -> list[str]:
        """``[node] stage: cause`` per problem and warning; folded by text where the table
        folds (the same cause on 200 nodes is one line)."""
        pairs = [(p.node, printable(str(p))) for p in self.problems]
        pairs += [(w.node, printable(f"warning: {w}")) for w in self.warnings]
        if self.folds(wide, width):
            return folded.grouped(pairs, width)
        return [f"[{node}] {text}" for node, text in pairs]

    def as_report(self) -> Report:
        """The same outcomes as drift's plain data (node -> stage -> outcome; each problem a
        health finding on its stage), for the HTML page and the metrics."""
        cells = self.cells()
        observed = {node: {stage: cells[stage][node] for stage in cells} for node in self.nodes}
        findings = [Finding(p.node, p.stage, "health", p.cause) for p in self.problems]
        return Report(
            self.cluster, list(self.nodes), observed, findings, compared_with="each other"
        )

    def _rows(self) -> list[list[str]]:
        rows = [["stage", *self.nodes]]
        for stage, outcome in self.stages.items():
            cells = [stage]
            for node in self.nodes:
                mine = [p for p in self.problems if p.node == node and p.stage == stage]
                warned = [w for w in self.warnings if w.node == node and w.stage == stage]
                cells.append(
                    "carried"
                    if node in self.carried and stage != "hygiene"
                    else "skipped"
                    if outcome == "skipped"
                    else ("FAIL" if mine else "ok, warning" if warned else "ok")
                )
            rows.append(cells)
        return rows
