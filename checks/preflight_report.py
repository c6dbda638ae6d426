"""The preflight's report: its problems, warnings, stage outcomes and details."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


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

    def table(self) -> str:
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
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
            for row in rows
        )
