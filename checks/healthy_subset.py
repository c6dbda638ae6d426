"""The largest healthy subset after a preflight: the nodes no problem names, in rank order,
optionally cut to a multiple of ``preflight.healthy_multiple_of`` (a job's data or model
parallel size). Plain functions; the preflight's report carries the result, so the controller
keeps every exclusion with its causes until a preflight passes the node again.

No problem naming a node is not proof that the others train together: after a failed
collective they never ran one among themselves. The subset says whom to try: the deploy
writes its launch files from the stamps this report's verdicts leave (trainfleet.stamps)."""

from __future__ import annotations

from typing import Any

from checks.preflight_report import Problem
from trainfleet import folded
from trainfleet.capabilities.launchers import HEALTHY
from trainfleet.defaults import LAUNCH_DIR
from trainfleet.node_sets import fold
from trainfleet.stamps import cut_to_multiple


def healthy_subset(
    nodes: list[str], problems: list[Problem], multiple_of: int | None = None
) -> dict[str, Any]:
    """``{"nodes": the subset in rank order, "excluded": {node: [causes]}, "multiple_of": K,
    "note": why there is no subset, or None}``.

    A node is left out for every problem that names it ("stage: cause"); where the isolation
    stage named culprits, the collective's own failures (every rank of a hung collective names
    its node) leave out only those. No subset when every node fails alike (the venv's or the
    script's fault, not a node's) or a problem names no node of the cluster. With K, the last
    healthy nodes in rank order are left out until the subset is a multiple of K."""
    culprits = {p.node for p in problems if p.stage == "isolation"}
    excluded: dict[str, list[str]] = {}
    for problem in problems:
        if problem.node not in nodes:
            continue
        if culprits and problem.stage == "collective" and problem.node not in culprits:
            continue
        causes = excluded.setdefault(problem.node, [])
        if str(problem) not in causes:
            causes.append(str(problem))
    strangers = sorted({p.node for p in problems if p.node not in nodes})
    note = None
    if strangers:
        note = f"a problem names no node of the cluster ({', '.join(strangers)})"
    elif len(excluded) == len(nodes) > 1 and len({tuple(c) for c in excluded.values()}) == 1:
        note = "every node failed alike: the cause is not one node's"
    healthy = [] if note else [node for node in nodes if node not in excluded]
    healthy, cut = cut_to_multiple(healthy, multiple_of)
    excluded |= cut
    return {
        "nodes": healthy,
        "excluded": {node: excluded[node] for node in nodes if node in excluded},
        "multiple_of": multiple_of,
        "note": note,
    }


FOLD_AT = 8  # more nodes than this in a list: folded (gpu[001-016,018-200])


def healthy_lines(subset: dict[str, Any], total: int) -> list[str]:
    """The subset for people: whom no problem names, who was left out and why."""
    if not subset["excluded"] and not subset["note"]:
        return []
    if subset["note"]:
        lines = [f"no healthy subset: {subset['note']}"]
    else:
        names = subset["nodes"]
        lines = [
            f"healthy subset: {len(names)} of {total} nodes, named by no problem: "
            + ((fold(names) if len(names) > FOLD_AT else ", ".join(names)) or "none")
            + f" (the next deploy writes their launch files in {LAUNCH_DIR}/{HEALTHY}/)"
        ]
    excluded = subset["excluded"]
    if len(excluded) <= FOLD_AT:
        return lines + [
            f"left out: {node}: {'; '.join(causes)}" for node, causes in excluded.items()
        ]
    # a few hundred nodes: one line per cause, with the folded nodes it left out
    return lines + folded.grouped(
        ((node, "; ".join(causes)) for node, causes in excluded.items()), indent="left out: "
    )
