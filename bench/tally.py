"""Reading a ``bench.lab_driver`` tally: remote commands per node and where the time went."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PHASES = ("startup", "connect", "prepare", "execute", "output")
# pyinfra stage entered -> the phase it starts
STAGE_STARTS = {
    "connect": "connect",
    "prepare": "prepare",
    "execute": "execute",
    "disconnect": "output",
}


@dataclass(frozen=True)
class ExecCount:
    """SSH exec requests per node in one run (nodes that got none count as 0)."""

    per_node: dict[str, int]

    @property
    def low(self) -> int:
        return min(self.per_node.values(), default=0)

    @property
    def high(self) -> int:
        return max(self.per_node.values(), default=0)

    @property
    def mean(self) -> float:
        return sum(self.per_node.values()) / len(self.per_node) if self.per_node else 0.0

    def describe(self) -> str:
        """``1`` when every node got the same, else ``mean (low–high)``."""
        if self.low == self.high:
            return str(self.high)
        return f"{self.mean:.1f} ({self.low}–{self.high})"


def exec_count(tally: dict[str, Any], nodes: list[str]) -> ExecCount:
    """Execs per node name. The tally counts by address; ``names`` maps addresses to nodes.

    Every node of ``nodes`` appears; an address outside them (a node's peer, or a
    transport closed before it could be named) is kept under its address so nothing is lost.
    """
    names = tally.get("names", {})
    per_node = {node: 0 for node in nodes}
    for address, count in tally.get("execs", {}).items():
        key = names.get(address, address)
        per_node[key] = per_node.get(key, 0) + int(count)
    return ExecCount(per_node)


def phases(tally: dict[str, Any]) -> dict[str, float]:
    """Seconds per phase of the run: startup (imports, inventory), connect, prepare (deploy
    code and the facts it reads), execute (operations), output (results, exit).

    A ``fact`` command has no execute stage: its facts are read in prepare.
    """
    marks = sorted(
        (float(s["at"]), STAGE_STARTS[s["stage"]])
        for s in tally.get("stages", [])
        if s["stage"] in STAGE_STARTS
    )
    out = {phase: 0.0 for phase in PHASES}
    current, since = "startup", 0.0
    for at, phase in marks:
        out[current] += at - since
        current, since = phase, at
    out[current] += float(tally["end"]) - since
    return {k: round(v, 3) for k, v in out.items()}


@dataclass(frozen=True)
class CommandStat:
    label: str
    count: int
    seconds: float


def top_commands(tally: dict[str, Any], limit: int = 3) -> list[CommandStat]:
    """The labels (facts, operations) whose remote commands took the most summed time."""
    stats = [
        CommandStat(label, int(v["count"]), float(v["seconds"]))
        for label, v in tally.get("commands", {}).items()
    ]
    return sorted(stats, key=lambda s: s.seconds, reverse=True)[:limit]


def short_label(label: str) -> str:
    """``fact facts.fingerprint.NodeFingerprint`` -> ``fact NodeFingerprint``."""
    kind, _, name = label.partition(" ")
    if kind == "fact":
        return f"fact {name.rsplit('.', 1)[-1]}"
    return label
