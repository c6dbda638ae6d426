"""Reachability verdicts: the listeners' PIDs a node printed, and who reached whom."""

from __future__ import annotations

import re
from collections.abc import Callable

from checks.attribution import few, pattern_problems
from checks.preflight_report import Problem
from trainfleet.model import Cluster

PID_MAX = 4_194_304  # the kernel's PID_MAX_LIMIT: no PID is larger


_PID_LINE = re.compile(r"pid ([1-9][0-9]{0,6})", re.ASCII)


def listener_pids(lines: list[str]) -> tuple[list[int], list[str]]:
    """The PIDs in a node's ``pid N`` lines, and the ``pid`` lines that are not exactly that
    (digits only, within the kernel's range): those are never put in a command."""
    pids: list[int] = []
    refused: list[str] = []
    for line in lines:
        if not line.startswith("pid"):
            continue
        match = _PID_LINE.fullmatch(line.rstrip("\r\n"))
        if match and int(match.group(1)) <= PID_MAX:
            pids.append(int(match.group(1)))
        else:
            refused.append(line)
    return pids, refused


def reachability_problems(cluster: Cluster, matrix: dict[str, dict[str, str]]) -> list[Problem]:
    """Stage 2: every node reaches every peer's listener on its cluster address, and the
    master's rendezvous port. ``matrix[src][target] = "ok" | reason``. A failure is named by the
    pattern (checks.attribution): a node no peer reaches, or that reaches none, alone; a single
    failing pair as a link on both its ends; a pattern no node or link explains on every node
    alike. A node that cannot reach its own listener is named for it; so is one that cannot reach
    the rendezvous port, unless no other node can (then the master is named)."""
    names = [n.name for n in cluster.nodes]
    problems = [
        Problem("reachability", src, f"cannot reach its own listener: {row[src]}")
        for src, row in sorted(matrix.items())
        if row.get(src, "ok") != "ok"
    ]
    tested = [(s, t) for s, row in matrix.items() for t in row if t in names and t != s]
    failed = [(s, t) for s, t in tested if matrix[s][t] != "ok"]
    problems += pattern_problems("reachability", names, tested, failed, _why(matrix))
    port = f"{cluster.master.name}:{cluster.master_port}"
    cut = [src for src in names if matrix.get(src, {}).get(port, "ok") != "ok"]
    if len(names) > 2 and set(names) - {cluster.master.name} <= set(cut):
        said = few([f"{src}: {matrix[src][port]}" for src in cut])
        problems.append(
            Problem("reachability", cluster.master.name, f"no node reaches {port}: {said}")
        )
    else:
        problems += [
            Problem("reachability", src, f"cannot reach {port}: {matrix[src][port]}") for src in cut
        ]
    return problems


def _why(matrix: dict[str, dict[str, str]]) -> Callable[[str, str], str]:
    return lambda src, target: f"{src} cannot reach {target}: {matrix[src][target]}"


def reachability_failed(matrix: dict[str, dict[str, str]]) -> bool:
    """Whether any probe failed: a collective over every node cannot succeed then (gloo and
    NCCL connect every rank to its peers), so it is not run to its timeout."""
    return any(result != "ok" for row in matrix.values() for result in row.values())


def rendezvous_unreachable(cluster: Cluster, matrix: dict[str, dict[str, str]]) -> list[str]:
    """The nodes that could not reach the master's rendezvous port: a collective cannot start
    without them (torch's store is there), so it is not run to its timeout."""
    port = f"{cluster.master.name}:{cluster.master_port}"
    return sorted(node for node, row in matrix.items() if row.get(port, "ok") != "ok")
