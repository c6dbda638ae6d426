"""Bandwidth verdicts: node pairs, bus bandwidth, the slow node or link."""

from __future__ import annotations

from typing import Any

from checks.collective_verdicts import node_causes, rank_failure, ranks_of
from checks.preflight_report import Problem
from trainfleet.model import Cluster
from trainfleet.text import printable


def busbw(algbw: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce: algbw * 2(n-1)/n, the traffic each rank's
    link carries, comparable across world sizes (0 for a single rank: no bus)."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


def pair_rounds(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """The node pairs of the bandwidth stage, in rounds of disjoint pairs (a node is in at most
    one pair per round, so pairs of a round run at once without sharing a NIC): the ring
    (0,1), (1,2), ... (N-1,0), so every node is in two pairs when N > 2 and a slow node can be
    told from a slow link. Each pair is (lower-ranked, higher-ranked)."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [[(nodes[0], nodes[1])]]
    rounds = [[(nodes[i], nodes[i + 1]) for i in range(start, n - 1, 2)] for start in (0, 1)]
    if n % 2:  # the wrap pair shares a node with both rounds above
        rounds.append([(nodes[0], nodes[n - 1])])
    else:
        rounds[1].append((nodes[0], nodes[n - 1]))
    return [r for r in rounds if r]


def pair_name(pair: tuple[str, ...]) -> str:
    return "-".join(pair)


def pair_figures(ranks: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """algbw and busbw (GB/s, 1e9 bytes as nccl-tests) of one pair's timed all_reduce, from
    every rank's ``bandwidth`` step; the time is the ranks' mean (nccl-tests' default). None
    unless every rank reported one sane figure for the same buffer: a partial run is no measure."""
    reports = [next((s for s in rank if s.get("step") == "bandwidth"), None) for rank in ranks]
    if not reports or any(r is None for r in reports):
        return None
    sizes = {r.get("bytes") for r in reports if r}
    seconds = [r.get("seconds") for r in reports if r]
    if len(sizes) != 1 or not all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in seconds
    ):
        return None
    (size,) = sizes
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    mean = sum(seconds) / len(seconds)
    algbw = size / mean / 1e9
    return {
        "ranks": len(ranks),
        "bytes": size,
        "seconds": mean,
        "algbw_gbps": round(algbw, 4),
        "busbw_gbps": round(busbw(algbw, len(ranks)), 4),
    }


def intruded_problems(cluster: Cluster, stage: str, jobs: list[str]) -> list[Problem]:
    """Every node named alike for ``jobs`` (pairs) that failed at an intruded rendezvous."""
    cause = (
        f"the rendezvous of {', '.join(jobs)} failed while a process that does not hold the "
        "run's secret connected to the pair's store: not one node's verdict, every node is "
        "named alike"
    )
    return [Problem(stage, node.name, cause) for node in cluster.nodes]


def unserved(host_rank: list[dict[str, Any]], port: int | None) -> str | None:
    """Why a pair's host rank 0 could not serve its rendezvous (an ``error`` step of stage
    ``store`` before it reached the store: the bind failed), else None."""
    if any(s.get("step") == "reached" for s in host_rank):
        return None
    errors = [s.get("error") for s in host_rank if s.get("step") == "error"]
    stages = [s.get("stage") for s in host_rank if s.get("step") == "error"]
    if "store" not in stages:
        return None
    error = errors[stages.index("store")]
    why = str(error).split(": ", 1)[-1] if str(error).startswith("cannot serve") else str(error)
    return f"cannot serve the pair's rendezvous on {port}: {printable(why)}"


def bandwidth_failures(
    cluster: Cluster,
    pair: tuple[str, ...],
    steps: dict[str, list[list[dict[str, Any]]]],
    port: int | None = None,
) -> list[Problem]:
    """A pair whose timed all_reduce gave no figure: each failing rank named in its own words,
    by node (and local rank); a host that could not serve the pair's rendezvous (``port``) is
    named alone (its partner only could not reach it); with no rank failing, the missing figure
    itself (no pass)."""
    host = ranks_of(cluster, steps, pair[0])
    if host and (why := unserved(host[0], port)):
        return [Problem("bandwidth", pair[0], why)]
    problems = []
    together = f"with {pair[1]}" if len(pair) == 2 else "alone"
    for node in pair:
        causes = [rank_failure(rank) for rank in ranks_of(cluster, steps, node)]
        with_peer = f"with {_peer(pair, node)}" if len(pair) == 2 else "its GPUs alone"
        problems += [
            Problem("bandwidth", node, f"the timed all_reduce {with_peer} did not finish: {cause}")
            for cause in node_causes(cluster, steps, node, causes)
        ]
    if not problems:
        problems = [
            Problem(
                "bandwidth",
                node,
                f"the timed all_reduce of {pair[0]} {together} reported no usable figure",
            )
            for node in pair
        ]
    return problems


def bandwidth_problems(
    measured: dict[tuple[str, ...], float], floor: float | None
) -> list[Problem]:
    """With a floor (GB/s): each pair under it fails. A node under the floor in every pair it is
    in (two or more) is the slow node; a slow pair of two nodes that reach the floor elsewhere
    is a slow link, named on both its nodes; with two nodes only, the pair is named (nothing
    tells the node from the link). ``measured``: pair (one node: intra-node) -> busbw."""
    if floor is None:
        return []
    slow = {pair: bw for pair, bw in measured.items() if bw < floor}
    pairs_of: dict[str, list[tuple[str, ...]]] = {}
    for pair in measured:
        for node in pair:
            pairs_of.setdefault(node, []).append(pair)
    # A node reaches the floor somewhere: it is not the slow one in its slow pairs. A node slow
    # in every pair is the slow node only if each of those peers reaches the floor elsewhere
    # (two slow neighbours would make a healthy node look slow in a ring).
    fine = {node for node, pairs in pairs_of.items() if any(p not in slow for p in pairs)}
    slow_nodes = [
        node
        for node, pairs in pairs_of.items()
        if len(pairs) >= 2
        and all(p in slow for p in pairs)
        and all(_peer(p, node) in fine for p in pairs)
    ]
    problems = []
    for node in slow_nodes:
        figures = ", ".join(f"with {_peer(p, node)}: {measured[p]:.2f}" for p in pairs_of[node])
        problems.append(
            Problem(
                "bandwidth",
                node,
                f"bus bandwidth under the floor of {floor:g} GB/s in every pair it "
                f"is in ({figures} GB/s): the node is slow",
            )
        )
    for pair, bw in slow.items():
        if any(node in slow_nodes for node in pair):
            continue
        if len(pair) == 1:
            cause = f"its GPUs' bus bandwidth {bw:.2f} GB/s is under the floor of {floor:g} GB/s"
        elif len(pairs_of[pair[0]]) < 2 or len(pairs_of[pair[1]]) < 2:
            cause = (
                f"bus bandwidth {bw:.2f} GB/s between {pair[0]} and {pair[1]} is under the floor "
                f"of {floor:g} GB/s (no third node to tell the slow node from the slow link)"
            )
        elif all(node in fine for node in pair):
            cause = (
                f"the link {pair_name(pair)} is slow: bus bandwidth {bw:.2f} GB/s, under the floor "
                f"of {floor:g} GB/s, while both nodes reach it with their other peer"
            )
        else:
            cause = (
                f"bus bandwidth {bw:.2f} GB/s between {pair[0]} and {pair[1]} is under the floor "
                f"of {floor:g} GB/s, and not both reach it with another peer: a slow node or link "
                "among them, not told apart"
            )
        problems += [Problem("bandwidth", node, cause) for node in pair]
    return problems


def _peer(pair: tuple[str, ...], node: str) -> str:
    return next((n for n in pair if n != node), node)
