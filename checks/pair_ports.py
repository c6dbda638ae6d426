"""The ports of the preflight's 2-node jobs (the bandwidth stage's pairs, the isolation's), and
which node hosts each one's rendezvous: the hygiene stage checks them for a holder before any
of them runs, as it checks the master port. No host is touched here."""

from __future__ import annotations

from checks.bandwidth_verdicts import pair_name, pair_rounds
from trainfleet.model import Cluster


def pair_port(cluster: Cluster, index: int) -> int:
    """The rendezvous port of a stage's ``index``-th pair: one of its own, after the master's."""
    return cluster.master_port + 1 + index


def rail_bound(cluster: Cluster) -> int:
    """The most rails a node may measure (checks.rail_verdicts.node_rails), known before the
    hygiene stage reads any node's NCCL_IB_HCA: one per GPU on GPU nodes, else the spec's
    interface rails; 0 below two."""
    declared = len(cluster.preflight.get("rails") or [])
    most = max(n.gpus for n in cluster.nodes) if cluster.uses_gpus else declared
    return most if most >= 2 else 0


def rail_port(cluster: Cluster, pair_index: int, rail: int) -> int:
    """The rendezvous port of the ``pair_index``-th node pair's (``bandwidth_rounds`` order) rail
    ``rail`` (0-based): the rail pairs run after the node pairs, on ports known before hygiene
    checks them, whatever rails the nodes turn out to have."""
    return pair_port(cluster, pair_index * rail_bound(cluster) + rail)


def pair_ports(cluster: Cluster, rounds: list[list[tuple[str, ...]]]) -> dict[tuple[str, ...], int]:
    """Each pair's rendezvous port (``pair_port``): by its index among all pairs of ``rounds``;
    a pair measured again keeps its own."""
    flat = [pair for pairs in rounds for pair in pairs]
    return {pair: pair_port(cluster, index) for index, pair in enumerate(flat)}


def rail_ports(
    cluster: Cluster, rounds: list[list[tuple[str, ...]]]
) -> dict[tuple[tuple[str, ...], int], int]:
    """Each node pair's rendezvous port on each rail it may have (``rail_port``), by the pair's
    index among all pairs of ``rounds``: ``{(pair, rail): port}`` (a lone node has no rails)."""
    flat = [pair for pairs in rounds for pair in pairs]
    bound = rail_bound(cluster)
    return {
        (pair, r): rail_port(cluster, index, r)
        for index, pair in enumerate(flat)
        if len(pair) == 2
        for r in range(bound)
    }


def bandwidth_rounds(cluster: Cluster) -> list[list[tuple[str, ...]]]:
    """The bandwidth stage's rounds of pairs (a single node with several GPUs: itself alone)."""
    names = [n.name for n in cluster.nodes]
    if len(names) > 1:
        return [list(pairs) for pairs in pair_rounds(names)]
    return [[(names[0],)]] if cluster.nodes[0].slots > 1 else []


def hosted_ports(cluster: Cluster) -> dict[str, dict[int, str]]:
    """Each node's ports that a pair's rendezvous may listen on there, and what uses each: a
    bandwidth pair on its first node; the isolation's first pass, the master with each node,
    on the master; its second pass (a suspect with a node known good, known only then) on any
    other node, so each of them may host any of its ports; a rail pair on its first node."""
    hosted: dict[str, dict[int, str]] = {n.name: {} for n in cluster.nodes}
    rounds = bandwidth_rounds(cluster)
    for pair, port in pair_ports(cluster, rounds).items():
        hosted[pair[0]].setdefault(port, f"the bandwidth pair {pair_name(pair)}")
    for (pair, _), port in rail_ports(cluster, rounds).items():
        hosted[pair[0]].setdefault(port, f"the bandwidth pair {pair_name(pair)}'s rails")
    if len(cluster.nodes) > 2:  # the isolation runs on three nodes or more
        master, *others = [n.name for n in cluster.nodes]
        for index, node in enumerate(others):
            hosted[master].setdefault(pair_port(cluster, index), f"the isolation's {master}-{node}")
        for node in others:
            for index in range(len(others) - 1):
                hosted[node].setdefault(pair_port(cluster, index), "an isolation pair")
    return hosted
