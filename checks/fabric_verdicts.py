"""Fabric verdicts: NCCL's own choice of network from its INFO log, InfiniBand ports and
MTUs that differ from a node's peers. No host is touched here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from checks.preflight_report import Problem
from trainfleet.capabilities.gpu_node import mtu_values
from trainfleet.compare import majority
from trainfleet.model import Cluster
from trainfleet.text import printable

# What NCCL prints at init (NCCL_DEBUG=INFO, subsystems INIT,NET), strongest evidence first:
# "Using network IB" (2.4+; "Using internal Network Socket" before), then the transport of
# each connection ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0", "Ring 00 : ... via
# NET/IB/0"), then which transports found devices ("NET/IB : Using [0]mlx5_0:1/IB ...").
_NAME = r"([A-Za-z][A-Za-z0-9_. -]{0,39}?)"  # "IB", "Socket", "IBext_v8", "AWS Libfabric"


_USING_NETWORK = re.compile(r"NCCL INFO Using (?:internal )?[Nn]etwork " + _NAME + r"\s*$")


_VIA_NET = re.compile(
    r"NCCL INFO (?:Channel|Ring) [0-9]{1,3}(?:/[0-9]{1,3})? : .* via NET/" + _NAME + "/"
)


_NET_IB_USING = re.compile(r"NCCL INFO NET/IB ?: ?Using \[?[0-9]")


_NET_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket ?: ?Using \[?[0-9]")


def nccl_network(lines: list[str]) -> tuple[str | None, str | None]:
    """(the network NCCL used, the log line that says so), or (None, None) when the log does not
    tell. Old NCCL prints "NET/Socket : Using" for its bootstrap even when it then uses IB, so
    a transport's device list counts only when nothing stronger was printed, IB's first."""
    for pattern in (_USING_NETWORK, _VIA_NET):
        for line in lines:
            if found := pattern.search(line):
                return found.group(1), line
    for pattern, network in ((_NET_IB_USING, "IB"), (_NET_SOCKET_USING, "Socket")):
        for line in lines:
            if pattern.search(line):
                return network, line
    return None, None


def active_ib_ports(network: dict[str, Any] | None) -> list[str]:
    """``mlx5_0 port 1`` for each ACTIVE InfiniBand/RoCE port of a node's NcclNetwork fact."""
    ports = (network or {}).get("ib_ports") or []
    return [
        f"{p['device']} port {p['port']}"
        for p in ports
        if "ACTIVE" in str(p.get("state", "")).upper()
    ]


def nccl_socket_problems(
    cluster: Cluster, logs: dict[str, list[list[str]]], networks: dict[str, dict[str, Any] | None]
) -> list[Problem]:
    """A node whose NCCL ranks went over sockets although it has an active IB/RoCE port ("GPU at
    100% but slow"), and one whose log names no network at all (fail closed): ``logs[node]`` is
    each of its ranks' NCCL INFO lines, from ranks that finished their collective. Nodes the
    spec keeps off IB (``nccl.ib: disable``), and single-node clusters (no network), are not
    judged."""
    if len(cluster.nodes) < 2:
        return []
    problems = []
    for node in cluster.nodes:
        active = active_ib_ports(networks.get(node.name))
        ranks = logs.get(node.name) or []
        if not active or node.nccl.get("ib") == "disable" or not ranks:
            continue
        chosen = [nccl_network(lines) for lines in ranks]
        sockets = [line for network, line in chosen if network == "Socket"]
        ports = f"{', '.join(active)} {'is' if len(active) == 1 else 'are'} active"
        if sockets:
            problems.append(
                Problem(
                    "collective",
                    node.name,
                    f"NCCL went over sockets although {ports} "
                    f"({printable(_info(str(sockets[0])), 160)}): training "
                    "runs at a fraction of the fabric's speed; check "
                    "NCCL_IB_DISABLE, NCCL_IB_HCA and the RDMA libraries "
                    "NCCL loads",
                )
            )
        elif any(network is None for network, _ in chosen):
            problems.append(
                Problem(
                    "collective",
                    node.name,
                    f"NCCL's INFO log names no network although {ports}: "
                    "whether it used them is unknown",
                )
            )
    return problems


def _info(line: str) -> str:
    """The part of an NCCL log line after its host:pid:tid [dev] prefix (which a user may name)."""
    at = line.find("NCCL INFO ")
    return line[at:] if at >= 0 else line


def ib_port_problems(cluster: Cluster, networks: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """A port (device, port) that is ACTIVE on a peer with the same HCA layout (the same set of
    ports), or on most nodes, but DOWN/INIT or missing on one node: named for that node. NCCL
    would silently run that node without it (NCCL_IB_HCA leaves it out; with no active port
    left, NCCL_IB_DISABLE=1 on that node alone). Nodes whose spec disables IB are not judged."""
    judged = {
        n.name: _ports(networks[n.name])
        for n in cluster.nodes
        if networks.get(n.name) is not None
        and n.nccl.get("ib") != "disable"
        and (n.gpus > 0 or _ports(networks[n.name]))
    }  # a CPU node without HCAs runs gloo
    problems = []
    for node, ports in judged.items():
        peers = {peer: p for peer, p in judged.items() if peer != node}
        for key in sorted({k for p in judged.values() for k in p}):
            if "ACTIVE" in ports.get(key, "").upper():
                continue
            active_on = sorted(
                (peer for peer, p in peers.items() if "ACTIVE" in p.get(key, "").upper()),
                key=lambda n: cluster.node(n).rank,
            )
            alike = [peer for peer in active_on if set(peers[peer]) == set(ports)]
            if not active_on or not (alike or len(active_on) > len(judged) / 2):
                continue
            state = f"is {_state(ports[key])}" if key in ports else "is missing"
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"InfiniBand {key[0]} port {key[1]} {state} here but ACTIVE on "
                    f"{', '.join(active_on)}: NCCL on this node would run without it",
                )
            )
    return problems


def mtu_problems(
    cluster: Cluster,
    networks: dict[str, dict[str, Any] | None],
    interfaces: Mapping[str, str | None],
) -> list[Problem]:
    """Every node's cluster interface has the same MTU, and so has each active IB/RoCE port
    on every node that has it: one node at 1500 among 9000s fragments or drops NCCL's and
    Gloo's traffic (RoCE: drops). ``interfaces``: each node's cluster interface, as its plan
    derived it (``NcclPlan.interface``), the one drift reads the MTU of too. The odd node is
    named against the majority; a node whose cluster interface's MTU cannot be read fails (a
    check that saw nothing never passes)."""
    problems: list[Problem] = []
    readings: dict[str, dict[str, str]] = {}
    for node in cluster.nodes:
        network = networks.get(node.name)
        if network is None:
            continue  # unreachable: named by the stages that need it
        mtu = mtu_values(network, interfaces.get(node.name))["cluster MTU"]
        if not mtu.isdigit():
            problems.append(
                Problem(
                    "hygiene",
                    node.name,
                    f"the MTU of the interface holding {node.address} cannot be read",
                )
            )
            continue
        readings.setdefault("the cluster interface's MTU", {})[node.name] = mtu
        for port in network.get("ib_ports") or []:
            if "ACTIVE" in str(port.get("state", "")).upper() and port.get("active_mtu"):
                key = f"{printable(str(port['device']), 32)} port {port['port']}'s active MTU"
                readings.setdefault(key, {})[node.name] = printable(str(port["active_mtu"]), 16)
    for what, values in readings.items():
        for finding in majority(what, values):
            if finding.kind == "tie":
                spread = finding.expected.replace("'", "")  # "1500 on 1, 9000 on 1"
                problems.append(
                    Problem(
                        "hygiene",
                        finding.node,
                        f"{what} is {finding.observed}, and no MTU is on most nodes ({spread})",
                    )
                )
            else:
                others = sorted(
                    (n for n, v in values.items() if v == finding.expected),
                    key=lambda n: cluster.node(n).rank,
                )
                problems.append(
                    Problem(
                        "hygiene",
                        finding.node,
                        f"{what} is {finding.observed}, {finding.expected} on "
                        f"{', '.join(others)}: traffic between them fragments or is dropped",
                    )
                )
    return problems


def _ports(network: dict[str, Any] | None) -> dict[tuple[str, int], str]:
    return {
        (str(p["device"]), int(p["port"])): str(p.get("state", ""))
        for p in (network or {}).get("ib_ports") or []
    }


def _state(state: str) -> str:
    """``4:ACTIVE`` -> ``DOWN (1:DOWN)`` style: the name, then the kernel's text."""
    name = state.partition(":")[2] or state or "in no known state"
    return f"{printable(name, 20)} ({printable(state, 20)})" if state else name
