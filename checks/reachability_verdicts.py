"""Reachability verdicts: the listeners' PIDs a node printed, and who reached whom."""

from __future__ import annotations

import re

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
    master's rendezvous port. ``matrix[src][target] = "ok" | reason``."""
    problems = []
    for src, row in matrix.items():
        for target, result in sorted(row.items()):
            if result != "ok":
                problems.append(Problem("reachability", src, f"cannot reach {target}: {result}"))
    return problems


def rendezvous_unreachable(cluster: Cluster, matrix: dict[str, dict[str, str]]) -> list[str]:
    """The nodes that could not reach the master's rendezvous port: a collective cannot start
    without them (torch's store is there), so it is not run to its timeout."""
    port = f"{cluster.master.name}:{cluster.master_port}"
    return sorted(node for node, row in matrix.items() if row.get(port, "ok") != "ok")
