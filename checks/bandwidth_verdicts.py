"""Bandwidth verdicts: node pairs, bus bandwidth, the slow node or link."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Hashable
from typing import Any, TypeVar

from checks.attribution import Attribution, attribute, few
from checks.collective_verdicts import node_causes, rank_failure, ranks_of
from checks.preflight_report import Problem
from trainfleet.model import Cluster
from trainfleet.schema import BUSBW_FRACTION
from trainfleet.text import printable

Item = TypeVar("Item", bound=Hashable)  # a node pair, or a rail pair


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


def busbw_median(measured: dict[tuple[str, ...], float]) -> float | None:
    """The cluster's reference figure: each node's best pair (what the node reaches with a good
    partner), the median of those. Not the median of the pairs: at three nodes two of the three
    pairs are a slow node's, and the pairs' median would be its figure. None: no pair of nodes."""
    best: dict[str, float] = {}
    for pair, bw in measured.items():
        if len(pair) == 2:
            for node in pair:
                best[node] = max(best.get(node, 0.0), bw)
    return statistics.median(best.values()) if best else None


def slow_pairs(
    measured: dict[tuple[str, ...], float],
    floor: float | None,
    fraction: float,
    median: float | None,
) -> list[tuple[str, ...]]:
    """The pairs a measurement finds slow (``median``: ``busbw_median`` of it): a node pair
    under ``fraction`` of the median or the floor, a lone node (intra-node) under the floor.
    Each is measured once more before it is judged (``confirmed_rounds``)."""
    return [
        pair
        for pair, bw in measured.items()
        if (
            _slow(bw, median, floor, fraction)
            if len(pair) == 2
            else floor is not None and bw < floor
        )
    ]


def confirmed_rounds(rounds: list[list[Item]], again: Collection[Item]) -> list[list[Item]]:
    """The stage's rounds with only the pairs (or rail pairs) to measure again (a node still in
    one pair per round), empty rounds dropped."""
    wanted = set(again)
    return [kept for pairs in rounds if (kept := [pair for pair in pairs if pair in wanted])]


def better_of_two(first: dict[str, Any], second: dict[str, Any] | None) -> dict[str, Any]:
    """A pair's figures once measured twice: the better measurement (noise on a shared host
    only ever slows a pair; a slow link or node is slow both times), with both busbw figures
    (``measured_gbps``; None where the second gave no figure)."""
    both = [first["busbw_gbps"], second["busbw_gbps"] if second else None]
    taken = second if second and second["busbw_gbps"] > first["busbw_gbps"] else {}
    return {**first, **taken, "measured_gbps": both}


def better(first: float, second: float | None) -> float:
    """The better of a rail pair's two figures, as ``better_of_two`` takes a node pair's (None:
    the second gave none, the first stands)."""
    return first if second is None else max(first, second)


def twice_text(figures: dict[str, Any]) -> str:
    """ " (measured twice: 0.23, 0.75 GB/s)" for a pair measured again, else ""."""
    both = figures.get("measured_gbps")
    if not both:
        return ""
    shown = ", ".join("no figure" if bw is None else f"{bw:.2f}" for bw in both)
    return f" (measured twice: {shown} GB/s, the better judged)"


def node_figures(details: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each measured node's best pair's bus bandwidth and the cluster's median (GB/s), from the
    bandwidth stage's details: what the stamps keep."""
    best: dict[str, float] = {}
    for pair in (details.get("pairs") or {}).values():
        if len(pair.get("nodes", [])) == 2:
            for node in pair["nodes"]:
                best[node] = max(best.get(node, 0.0), pair["busbw_gbps"])
    median = details.get("median_gbps")
    return {node: {"busbw_gbps": bw, "median_gbps": median} for node, bw in best.items()}


def bandwidth_problems(
    measured: dict[tuple[str, ...], float],
    floor: float | None,
    fraction: float = BUSBW_FRACTION,
    nodes: list[str] | None = None,
    median: float | None = None,
) -> list[Problem]:
    """Each pair against the cluster's median (``busbw_median``; ``median``: the one the first
    measurement gave, where slow pairs were measured again): under ``fraction`` of it, or
    under the spec's ``floor`` (GB/s, None: none), it is slow. The slow pairs are judged by
    their pattern (checks.attribution): a node slow with every partner (each fast elsewhere) is
    the slow node, named alone with its figure and the median; a pair slow only together is a
    slow link, named on both its nodes; a node slow only with partners slow themselves is not
    told from them; a pattern no node or link explains names every node alike; with two nodes
    only, the pair (nothing tells the node from the link). ``measured``: pair (one node:
    intra-node, judged by the floor alone) -> busbw; ``nodes``: rank order."""
    problems = [
        Problem(
            "bandwidth",
            pair[0],
            f"its GPUs' bus bandwidth {bw:.2f} GB/s is under the floor of {floor:g} GB/s",
        )
        for pair, bw in measured.items()
        if len(pair) == 1 and floor is not None and bw < floor
    ]
    pairs = {pair: bw for pair, bw in measured.items() if len(pair) == 2}
    median = busbw_median(pairs) if median is None else median
    slow = {pair: bw for pair, bw in pairs.items() if _slow(bw, median, floor, fraction)}
    if not slow or median is None:
        return problems
    order = nodes or list(dict.fromkeys(node for pair in pairs for node in pair))
    against = _against(median, floor, fraction)
    verdict = attribute(order, list(pairs), list(slow))
    if len(order) == 2:
        ((pair, bw),) = slow.items()
        cause = (
            f"bus bandwidth {bw:.2f} GB/s between {pair[0]} and {pair[1]} is under the floor "
            f"of {floor:g} GB/s (no third node to tell the slow node from the slow link)"
        )
        return problems + [Problem("bandwidth", node, cause) for node in pair]
    if verdict.unexplained:
        listed = few([f"{pair_name(p)} {bw:.2f} GB/s" for p, bw in slow.items()])
        cause = (
            f"{len(slow)} of {len(pairs)} pairs are slow ({listed}; {against}): no single "
            "node or link explains it, a slow node or link among them not told apart"
        )
        return problems + [Problem("bandwidth", node, cause) for node in order]

    def node_cause(node: str, best: float, figures: str) -> str:
        partners = [_peer(p, node) for p in slow if node in p]
        if all(peer in verdict.nodes for peer in partners):
            return (
                f"slow: {best:.2f} GB/s, {against} ({figures} GB/s), but only "
                f"with {', '.join(partners)}, slow themselves: not told from them"
            )
        return (
            f"slow: {best:.2f} GB/s, {against} ({figures} GB/s): "
            "the node is slow with every partner"
        )

    def link_cause(a: str, b: str, bw: float) -> str:
        return (
            f"the link {a}-{b} is slow: {bw:.2f} GB/s, {against}, while both nodes reach it "
            "with their other partners"
        )

    return problems + attributed_problems(verdict, pairs, node_cause, link_cause)


def attributed_problems(
    verdict: Attribution,
    pairs: dict[Any, float],
    node_cause: Callable[[str, float, str], str],
    link_cause: Callable[[str, str, float], str],
) -> list[Problem]:
    """The slow nodes and links an attribution names, each with its figures: a node with its
    best pair and each partner's (``node_cause(node, best, figures)``), a link on both its
    nodes with its pair's figure (``link_cause(a, b, bw)``). The per-node and per-rail judges
    differ only in their words."""
    problems = []
    for node in verdict.nodes:
        best, figures = node_figures_text(pairs, node)
        problems.append(Problem("bandwidth", node, node_cause(node, best, figures)))
    for a, b in verdict.links:
        cause = link_cause(a, b, link_figure(pairs, a, b))
        problems += [Problem("bandwidth", a, cause), Problem("bandwidth", b, cause)]
    return problems


# A node slow only with partners slow themselves takes three culprits in a ring, and three faults
# are a minority (checks.attribution) from seven nodes: only there can a re-test be needed.
RETEST_MIN_NODES = 7


def retest_pairs(
    measured: dict[tuple[str, ...], float],
    floor: float | None,
    fraction: float,
    nodes: list[str],
    median: float | None = None,
) -> list[tuple[str, str]]:
    """(a partner known good, the suspect) for each node the ring could not tell from its slow
    partners (slow only with nodes slow themselves), each partner a node in no slow pair, one
    pair per partner (the pairs run at once): the re-test tells whether it is slow itself."""
    pairs = {pair: bw for pair, bw in measured.items() if len(pair) == 2}
    median = busbw_median(pairs) if median is None else median
    slow = [pair for pair, bw in pairs.items() if _slow(bw, median, floor, fraction)]
    if not slow or median is None:
        return []
    verdict = attribute(nodes, list(pairs), slow)
    suspects = [
        node
        for node in verdict.nodes
        if all(_peer(p, node) in verdict.nodes for p in slow if node in p)
    ]
    good = [n for n in nodes if not any(n in p for p in slow) and any(n in p for p in pairs)]
    return list(zip(good, suspects, strict=False))


def retested_problems(
    problems: list[Problem],
    figures: dict[str, tuple[str, float | None]],
    median: float,
    floor: float | None,
    fraction: float,
) -> list[Problem]:
    """The bandwidth problems after the re-test (``figures``: suspect -> (its partner known
    good, the pair's busbw, None: no figure)): a suspect as slow with that partner is the slow
    node; one fast with it is cleared (it was slow only with slow nodes); one the re-test gave
    no figure for keeps its verdict (no figure is no pass)."""
    after = []
    for problem in problems:
        if problem.node not in figures:
            after.append(problem)
            continue
        partner, bw = figures[problem.node]
        if bw is None:
            after.append(
                Problem(
                    "bandwidth",
                    problem.node,
                    f"{problem.cause}; its re-test with {partner} gave no figure",
                )
            )
        elif _slow(bw, median, floor, fraction):
            cause = (
                f"slow: {bw:.2f} GB/s with {partner}, a partner known good, "
                f"{_against(median, floor, fraction)}: the node is slow with every partner"
            )
            after.append(Problem("bandwidth", problem.node, cause))
    return after


def _slow(bw: float, median: float | None, floor: float | None, fraction: float) -> bool:
    return (median is not None and bw < fraction * median) or (floor is not None and bw < floor)


def _against(median: float, floor: float | None, fraction: float) -> str:
    """What a slow figure fell under: "median 0.40" (a fraction of it), and the floor if any."""
    words = f"median {median:.2f}"
    return words + (f", floor {floor:g} GB/s" if floor is not None else "")


def _peer(pair: tuple[str, ...], node: str) -> str:
    return next((n for n in pair if n != node), node)


def node_figures_text(pairs: dict[Any, float], node: str) -> tuple[float, str]:
    """A node's best pair figure and its figures with each partner (``with node2: 0.05,
    ...``), as the causes of the per-node and the per-rail judges say them."""
    mine = {p: bw for p, bw in pairs.items() if node in p}
    return max(mine.values()), ", ".join(
        f"with {_peer(p, node)}: {bw:.2f}" for p, bw in mine.items()
    )


def link_figure(pairs: dict[Any, float], a: str, b: str) -> float:
    """A pair's figure, whichever way round it was measured (0 where it was not)."""
    return pairs.get((a, b), pairs.get((b, a), 0.0))
