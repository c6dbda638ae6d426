"""Rail verdicts: which rails each node has, the rail-aligned pairs (rail i of a node with rail i
of its partner, one interface or HCA each) and the slow rail, named on its node ("node3 rail
eth2", "node7 mlx5_4"). Plain data in and out; the pairs run in checks.rail_stage.

A node pair over all its rails hides one slow rail behind the others (on 8 rails, one slow HCA
costs a few percent); rail by rail it is as plain as a slow node. Each rail is judged as the
node pairs are (checks.bandwidth_verdicts): its pairs against the rail's own median, by the
pattern (checks.attribution). A rail whose median is itself under the fraction of the best
rail's is slow on every node: its fabric (a switch, a cable bundle), not one node's rail.
"""

from __future__ import annotations

import re
from typing import Any

from checks.attribution import attribute, few
from checks.bandwidth_verdicts import attributed_problems, busbw_median, pair_name
from checks.collective_verdicts import rank_failure
from checks.preflight_report import Problem
from trainfleet.model import Cluster
from trainfleet.nccl import hca_list
from trainfleet.text import printable

RAIL_NAME = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")  # an interface or an HCA (mlx5_4, mlx5_4:1)

Pair = tuple[str, ...]
RailPair = tuple[Pair, int]  # a node pair, on rail index r (0-based) of both nodes


def hca_entries(value: str) -> list[str]:
    """NCCL_IB_HCA's HCAs, in order ('=' exact or plain prefixes alike); none for an exclusion
    list ('^'), which names the HCAs not used, or for a list with a name that is no name."""
    if value.startswith("^"):
        return []
    names = hca_list(value)
    return names if all(RAIL_NAME.fullmatch(n) for n in names) else []


def node_rails(cluster: Cluster, envs: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """Each node's compute rails as the ranks take them (``if:eth1``, ``hca:mlx5_4``): on GPU
    nodes, the HCAs its NCCL_IB_HCA lists (``envs``: each node's environment as the ranks get
    it), else the spec's ``preflight.rails`` interfaces; one rank per rail, so a GPU node has at
    most one rail per GPU. A node with fewer than two rails has none to tell apart: []."""
    declared = [f"if:{name}" for name in cluster.preflight.get("rails") or []]
    rails: dict[str, list[str]] = {}
    for node in cluster.nodes:
        hcas = hca_entries((envs.get(node.name) or {}).get("NCCL_IB_HCA", ""))
        mine = [f"hca:{h}" for h in hcas] if cluster.uses_gpus and hcas else declared
        if cluster.uses_gpus:
            mine = mine[: node.gpus]
        rails[node.name] = mine if len(mine) >= 2 else []
    return rails


def rail_label(rail: str) -> str:
    """A rail as people name it: the interface or HCA alone (``eth2``, ``mlx5_4``)."""
    return rail.split(":", 1)[1]


def rail_rounds(rounds: list[list[Pair]], rails: dict[str, list[str]]) -> list[list[RailPair]]:
    """The bandwidth stage's rounds of node pairs, each pair on every rail both its nodes have:
    rail i's pairs of a round run at once on every rail (a node's rails are separate NICs or
    HCAs, one rank each), as the node pairs of a round do."""
    out = []
    for pairs in rounds:
        mine = [
            (pair, r)
            for pair in pairs
            if len(pair) == 2
            for r in range(min(len(rails.get(pair[0], [])), len(rails.get(pair[1], []))))
        ]
        if mine:
            out.append(mine)
    return out


def rail_pair_name(pair: Pair, r: int, rails: dict[str, list[str]]) -> str:
    """``node1-node2 rail 2 (eth2-eth2)``: the rail's index (1-based) and each end's name."""
    ends = "-".join(rail_label(rails[node][r]) for node in pair)
    return f"{pair_name(pair)} rail {r + 1} ({ends})"


def rail_failures(
    pair: Pair, r: int, rails: dict[str, list[str]], steps: dict[str, list[dict[str, Any]]]
) -> list[Problem]:
    """A rail pair that gave no figure: each end whose rank failed, in its own words, on its
    rail; with no rank failing, both ends (no figure is no pass)."""
    problems = []
    for node in pair:
        peer = next(n for n in pair if n != node)
        rail = rail_label(rails[node][r])
        if cause := rank_failure(steps.get(node) or []):
            problems.append(
                Problem(
                    "bandwidth",
                    node,
                    f"rail {rail}: the timed all_reduce with {peer}'s rail "
                    f"{rail_label(rails[peer][r])} did not finish: {printable(cause)}",
                )
            )
    if not problems:
        name = rail_pair_name(pair, r, rails)
        problems = [
            Problem(
                "bandwidth",
                node,
                f"rail {rail_label(rails[node][r])}: the timed all_reduce of {name} reported no "
                "usable figure",
            )
            for node in pair
        ]
    return problems


def rail_medians(measured: dict[RailPair, float]) -> dict[int, float]:
    """Each rail's median (checks.bandwidth_verdicts.busbw_median over its pairs)."""
    by_rail = _by_rail(measured)
    return {r: m for r, pairs in by_rail.items() if (m := busbw_median(pairs)) is not None}


def slow_rail_pairs(
    measured: dict[RailPair, float], fraction: float, medians: dict[int, float]
) -> list[RailPair]:
    """The rail pairs a measurement finds slow as ``rail_problems`` judges them (``medians``:
    ``rail_medians`` of it): every pair of a rail slow on every node, and each pair under
    ``fraction`` of its own rail's median. Each is measured once more before it is judged."""
    return [
        (pair, r)
        for (pair, r), bw in measured.items()
        if r in medians and (fabric_slow(medians, r, fraction) or bw < fraction * medians[r])
    ]


def judged_medians(
    medians: dict[int, float], measured: dict[RailPair, float], again: set[RailPair]
) -> dict[int, float]:
    """The rail medians to judge by once the slow rail pairs were measured again (``medians``:
    the first measurement's; ``measured``: each pair's better figure; ``again``: the pairs
    measured twice). A rail whose every pair was measured again (slow on every node the first
    time: the rail itself on trial) takes the median of its better figures, as each of its
    pairs is judged by its better figure: one healthy pair slowed by noise the first time made
    that median, and with it the whole rail, look slow. Every other rail keeps the first
    median: a pair measured once is judged against the median it was measured with."""
    judged = dict(medians)
    for r, pairs in _by_rail(measured).items():
        if r in medians and all((pair, r) in again for pair in pairs):
            judged[r] = busbw_median(pairs) or medians[r]
    return judged


def fabric_slow(medians: dict[int, float], r: int, fraction: float) -> bool:
    """Rail ``r`` is slow on every node: its median under ``fraction`` of the best rail's (with
    two rails or more: one rail alone has nothing to be slower than)."""
    return len(medians) > 1 and medians[r] < fraction * max(medians.values())


def rail_problems(
    measured: dict[RailPair, float],
    rails: dict[str, list[str]],
    fraction: float,
    nodes: list[str],
    medians: dict[int, float] | None = None,
) -> list[Problem]:
    """Each rail judged alone: a rail whose median is under ``fraction`` of the best rail's is
    slow on every node (named on each of them: the rail's fabric, no one node); else its pairs
    against its own median, by their pattern (checks.attribution): a node's rail slow with every
    partner is named on that node with its rail, a rail pair slow only together is a link on
    that rail, a pattern nothing explains names every node of the rail alike. ``medians``:
    ``judged_medians``, where slow rail pairs were measured again."""
    medians = rail_medians(measured) if medians is None else medians
    best = max(medians.values(), default=None)
    problems: list[Problem] = []
    for r, pairs in sorted(_by_rail(measured).items()):
        median = medians.get(r)
        order = [n for n in nodes if any(n in pair for pair in pairs)]
        names = {node: rail_label(rails[node][r]) for node in order}
        label = f"rail {r + 1} ({'/'.join(dict.fromkeys(names.values()))})"
        if median is None or best is None:
            continue
        if fabric_slow(medians, r, fraction):
            cause = (
                f"{label} is slow on every node: its median {median:.2f} GB/s is under "
                f"{fraction:g} of the best rail's {best:.2f} GB/s: the rail's fabric (its "
                "switch or cables), not one node"
            )
            problems += [Problem("bandwidth", node, cause) for node in order]
            continue
        slow = {p: bw for p, bw in pairs.items() if bw < fraction * median}
        if slow:
            problems += _slow_on_rail(order, pairs, slow, names, label, median)
    return problems


def _slow_on_rail(
    order: list[str],
    pairs: dict[Pair, float],
    slow: dict[Pair, float],
    names: dict[str, str],
    label: str,
    median: float,
) -> list[Problem]:
    against = f"median {median:.2f} of {label}"
    verdict = attribute(order, [(p[0], p[1]) for p in pairs], [(p[0], p[1]) for p in slow])
    if verdict.unexplained or len(order) < 3:
        listed = few([f"{pair_name(p)} {bw:.2f} GB/s" for p, bw in slow.items()])
        cause = (
            f"{label}: {len(slow)} of {len(pairs)} rail pairs are slow ({listed}; {against}): "
            "no single node's rail or link explains it"
        )
        return [Problem("bandwidth", node, cause) for node in order]
    return attributed_problems(
        verdict,
        pairs,
        lambda node, best, figures: (
            f"rail {names[node]} slow: {best:.2f} GB/s, {against} ({figures} "
            "GB/s): the node's rail is slow with every partner on it"
        ),
        lambda a, b, bw: (
            f"the {label} link {a} {names[a]}-{b} {names[b]} is slow: {bw:.2f} GB/s, {against}, "
            "while both rails reach it with their other partners"
        ),
    )


def _by_rail(measured: dict[RailPair, float]) -> dict[int, dict[Pair, float]]:
    by_rail: dict[int, dict[Pair, float]] = {}
    for (pair, r), bw in measured.items():
        by_rail.setdefault(r, {})[pair] = bw
    return by_rail
