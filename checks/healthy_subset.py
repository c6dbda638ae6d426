"""The largest healthy subset after a preflight: the nodes no problem names, in rank order,
optionally cut to a multiple of ``preflight.healthy_multiple_of`` (a job's data or model
parallel size). Plain functions; the preflight's report carries the result, so the controller
keeps every exclusion with its causes until a preflight passes the node again."""

from __future__ import annotations

from typing import Any

from checks.preflight_report import Problem


def healthy_subset(
    nodes: list[str], problems: list[Problem], multiple_of: int | None = None
) -> dict[str, Any]:
    """``{"nodes": the healthy subset in rank order, "excluded": {node: [causes]},
    "multiple_of": K}``: a node is left out for every problem that names it ("stage: cause"),
    and, with K, the last healthy ones in rank order are left out until the subset's size is a
    multiple of K (none left when fewer than K pass). The subset's first node is its master."""
    excluded: dict[str, list[str]] = {}
    for problem in problems:
        if problem.node in nodes:
            causes = excluded.setdefault(problem.node, [])
            if str(problem) not in causes:
                causes.append(str(problem))
    healthy = [node for node in nodes if node not in excluded]
    if multiple_of and len(healthy) % multiple_of:
        keep = len(healthy) - len(healthy) % multiple_of
        for node in healthy[keep:]:
            excluded[node] = [f"left out to keep the subset a multiple of {multiple_of}"]
        healthy = healthy[:keep]
    return {
        "nodes": healthy,
        "excluded": {node: excluded[node] for node in nodes if node in excluded},
        "multiple_of": multiple_of,
    }


def healthy_lines(subset: dict[str, Any], total: int) -> list[str]:
    """The subset for people: who can train, and who was left out and why."""
    if not subset["excluded"]:
        return []
    lines = [
        f"healthy subset: {len(subset['nodes'])} of {total} nodes can train together: "
        + (", ".join(subset["nodes"]) or "none")
    ]
    lines += [
        f"left out: {node}: {'; '.join(causes)}" for node, causes in subset["excluded"].items()
    ]
    return lines
