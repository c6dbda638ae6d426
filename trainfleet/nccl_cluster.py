"""The cross-node rules of the NCCL environment: every node derived (trainfleet.nccl) with
the NCCL that will run there, then the nodes that disagree named (the pinned GID index, the
RoCE address family, the compute rails, by trainfleet.compare.majority). Apart from
trainfleet.nccl and trainfleet.rails so that the facts, which read those, stay clear of the
comparison."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainfleet.compare import Finding, majority
from trainfleet.model import Cluster
from trainfleet.nccl import Derived, derive, gid_disagreement, network_rails
from trainfleet.nccl_gids import deciding_release
from trainfleet.nccl_qos import live_readings, node_qos
from trainfleet.rails import Rails


def node_release(cluster: Cluster, stack: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """The NCCL release that decides a node's GID settings: the oldest of the spec's pinned
    libnccl2 and the NCCL the node's torch reports (read only where a GPU is usable)."""
    torch = (stack or {}).get("torch") or {}
    return deciding_release([cluster.stack.get("nccl"), torch.get("nccl")])


def family_disagreement(derived: Mapping[str, Derived]) -> dict[str, str]:
    """node -> why, for nodes whose RoCE rails use another address family than most nodes'
    (an IPv4-mapped GID and an IPv6 one cannot reach each other): trainfleet.compare.majority."""
    families = {
        name: d.env["NCCL_IB_ADDR_FAMILY"]
        for name, d in derived.items()
        if "NCCL_IB_ADDR_FAMILY" in d.env and d.env.get("NCCL_IB_DISABLE") != "1"
    }
    return {
        f.node: (
            f"NCCL_IB_ADDR_FAMILY is {f.observed} here but {f.expected} on most nodes"
            if f.kind == "majority"
            else f"nodes split evenly on NCCL_IB_ADDR_FAMILY ({f.expected}): {f.observed} here"
        )
        for f in majority("NCCL_IB_ADDR_FAMILY", families)
    }


def derive_cluster(
    cluster: Cluster, networks: Mapping[str, Any], stacks: Mapping[str, Any] | None = None
) -> dict[str, Derived]:
    """Every node whose network was read (``networks``: node -> NcclNetwork fact, or None),
    derived with the cross-node rules applied: RoCE nodes that disagree on the pinned GID
    index, or on the address family, get that as a problem. ``stacks`` (node -> the stack
    fact) gives the NCCL torch runs. The deploy writes from this and drift expects this, so
    drift never expects files the deploy would refuse to write."""
    derived = {
        node.name: derive(
            node.address,
            node.nccl,
            networks[node.name]["interfaces"],
            networks[node.name]["ib_ports"],
            network_rails(networks[node.name]),
            release=node_release(cluster, (stacks or {}).get(node.name)),
        )
        for node in cluster.nodes
        if networks.get(node.name) is not None
    }
    for node in cluster.nodes:
        if node.name in derived:
            host_qos(derived[node.name], networks[node.name], node.nccl["env"].get("NCCL_IB_TC"))
    disagreement = gid_disagreement({name: d.gid_index for name, d in derived.items()})
    if disagreement:
        for d in derived.values():
            if d.gid_index is not None:
                d.problems.append(disagreement)
    for name, why in family_disagreement(derived).items():
        derived[name].problems.append(why)
    return derived


def host_qos(derived: Derived, network: Mapping[str, Any], spec_tc: str | None) -> None:
    """NCCL_IB_TC from the host's own QoS on its RoCE rails (trainfleet.nccl_qos), where the
    spec sets none and one can be derived; the readings the majority compares and what is
    wrong with them go into ``derived.qos`` and ``derived.qos_problems``."""
    hca = derived.env.get("NCCL_IB_HCA", "")
    if derived.problems or not hca or derived.env.get("NCCL_IB_DISABLE") == "1":
        return
    readings = live_readings(network, hca.lstrip("^=").split(","))
    if not readings:  # InfiniBand rails only: traffic classes are RoCE's
        return
    found = node_qos(readings, None if spec_tc is None else str(spec_tc))
    if spec_tc is None and "NCCL_IB_TC" in found.env:
        derived.env["NCCL_IB_TC"] = found.env["NCCL_IB_TC"]
    derived.qos = dict(found.values)
    derived.qos_problems = [*found.problems, *found.unset]


def rail_values(rails: Rails) -> dict[str, str]:
    """A node's rails as the majority compares them: one property for the count and link
    layer, one a rail (a rail the node lacks: why it was left out, or absent)."""
    layers = sorted({r.link_layer or "link layer unknown" for r in rails.rails})
    values = {"rails": f"{len(rails.rails)}: {', '.join(layers) or 'none'}"}
    values |= {f"rail {r.hca}": r.describe() for r in rails.rails}
    values |= {f"rail {hca}": f"not a rail: {why}" for hca, why in rails.left_out.items()}
    return values


def odd_rails(by_node: Mapping[str, Rails]) -> list[Finding]:
    """The nodes whose rails differ from the majority's: count and link layer, and each rail
    (the GPUs it serves, link layer, rate), named with the rail (trainfleet.compare.majority)."""
    values = {node: rail_values(rails) for node, rails in by_node.items()}
    names = sorted({prop for node_values in values.values() for prop in node_values})
    findings: list[Finding] = []
    for prop in names:
        findings += majority(prop, {n: v.get(prop, "absent") for n, v in values.items()})
    return findings
