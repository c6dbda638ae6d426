"""Deriving each node's NCCL network environment from what its network offers.

Plain functions over the NcclNetwork fact's data, testable without any host:
- the socket interface is the one that holds the node's cluster address (never a
  guess by name or order, which is how NCCL ends up on an unreachable second NIC);
- InfiniBand/RoCE comes from sysfs: the compute rails become NCCL_IB_HCA (trainfleet.rails:
  the ports under a GPU's PCIe switch where nvidia-smi topo -m is known, else every active
  port; never InfiniBand and RoCE mixed), RoCE v2 picks NCCL_IB_GID_INDEX, no rail disables IB;
- spec values override derived ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_interface
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from trainfleet.rails import HcaPort, Rails, without_affinity

if TYPE_CHECKING:
    from trainfleet.model import Cluster

ENV_PURPOSE = "nccl environment"
# The variable families `nccl.env` may set (the schema's grammar is built from this list, the
# preflight's hygiene script is handed it): NCCL's, Gloo's and UCX's own, and PyTorch's and
# CUDA's (TORCH_NCCL_ASYNC_ERROR_HANDLING and CUDA_DEVICE_MAX_CONNECTIONS are real needs).
ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TORCH_", "CUDA_")
# Families set on nodes for other reasons too (CUDA_HOME from a CUDA profile script): a check
# compares only the variables of these the plan names.
SHARED_PREFIXES = ("TORCH_", "CUDA_")
# The rest, each of whose variables changes how NCCL, Gloo or UCX talk: a check compares every
# one a shell sees (a stray one is drift).
OWNED_PREFIXES = tuple(p for p in ENV_PREFIXES if p not in SHARED_PREFIXES)
ENV_NAME = re.compile("(?:" + "|".join(re.escape(p) for p in ENV_PREFIXES) + ")[A-Z0-9_]+")
NEVER = ("lo", "docker", "virbr", "veth", "cni", "flannel", "cali")  # never the cluster interface


class Interface(TypedDict):
    name: str
    addresses: list[str]
    bridge: bool
    cidrs: NotRequired[list[str]]  # the addresses with their prefix length, e.g. "198.18.0.11/24"
    mtu: NotRequired[int]  # /sys/class/net/<name>/mtu


class Gid(TypedDict):
    index: int
    type: str  # "IB/RoCE_v1" | "RoCE_v2" (spaces as underscores)
    gid: str
    ndev: str | None


class IbPort(TypedDict):
    device: str
    port: int
    link_layer: str  # "InfiniBand" | "Ethernet" (RoCE)
    state: str  # "4:ACTIVE", "1:DOWN", ...
    gids: list[Gid]
    active_mtu: NotRequired[int]  # ibv_devinfo's active_mtu (absent where it is not installed)


@dataclass
class Derived:
    """A node's environment, and what stood in the way of deriving it."""

    env: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    interface: str | None = None
    gid_index: int | None = None
    network: str | None = None  # the cluster address's subnet, e.g. "198.18.0.0/24"


def cluster_interface(interfaces: list[Interface], address: str) -> tuple[str | None, str | None]:
    """(name, None) of the interface holding ``address``, or (None, why not)."""
    holders = [i["name"] for i in interfaces if address in i["addresses"]]
    if not holders:
        have = (
            ", ".join(
                f"{i['name']}={'/'.join(i['addresses'])}" for i in interfaces if i["addresses"]
            )
            or "none"
        )
        return None, f"no interface holds the cluster address {address} (interfaces: {have})"
    name = holders[0]
    if name.startswith(NEVER):
        return None, f"the cluster address {address} is on {name}, which NCCL must never use"
    return name, None


def cluster_network(interfaces: list[Interface], address: str) -> str | None:
    """The subnet of the interface address that is the node's cluster address, if known."""
    for interface in interfaces:
        for cidr in interface.get("cidrs", []):
            if cidr.split("/")[0] == address:
                return str(ip_interface(cidr).network)
    return None


def ucx_devices(env: dict[str, str], interface: str | None) -> str | None:
    """UCX_NET_DEVICES: the active InfiniBand/RoCE ports NCCL uses, else the cluster interface."""
    hca = env.get("NCCL_IB_HCA")
    if hca and env.get("NCCL_IB_DISABLE") != "1":
        return hca.lstrip("^=")
    return interface


def _ipv4_mapped(gid: str) -> bool:
    return gid.replace(":", "").lower().startswith("00000000000000000000ffff")


def fact_ports(ports: list[IbPort]) -> list[HcaPort]:
    """The NcclNetwork fact's ports as the rails rule reads them (the fact reads no rate)."""
    return [HcaPort(p["device"], p["port"], p["link_layer"], p["state"]) for p in ports]


def hca_unknown(spec_hca: str, ports: list[IbPort]) -> str | None:
    """Why the spec's NCCL_IB_HCA (``=`` exact names, else name prefixes, as NCCL reads it)
    names a device or port this node does not have, if it does."""
    exact = spec_hca.startswith("=")

    def present(entry: str) -> bool:
        device, _, port = entry.partition(":")
        return any(
            (p["device"] == device if exact else p["device"].startswith(device))
            and (not port or str(p["port"]) == port)
            for p in ports
        )

    missing = [e for e in spec_hca.lstrip("=").split(",") if e and not present(e)]
    if not missing:
        return None
    have = ", ".join(f"{p['device']}:{p['port']}" for p in ports) or "no InfiniBand/RoCE port"
    return (
        f"nccl.env NCCL_IB_HCA names {', '.join(missing)}, which this node does not have "
        f"(it has {have})"
    )


def ib_settings(
    ports: list[IbPort], rails: Rails | None = None, spec_hca: str | None = None
) -> tuple[dict[str, str], int | None, list[str]]:
    """NCCL_IB_* for the node's compute rails (``rails``: by GPU affinity where the node has
    such a source, else every active port): (env, RoCE v2 GID index, problems). Rails that
    mix link layers are a problem unless the spec names the HCAs (``spec_hca``: its
    NCCL_IB_HCA, which then also decides whose GIDs count)."""
    rails = rails or without_affinity(fact_ports(ports))
    named = spec_hca is not None and not spec_hca.startswith("^")
    blockers = [*rails.problems, *([rails.mixed] if rails.mixed and not named else [])]
    if named and spec_hca is not None and (unknown := hca_unknown(spec_hca, ports)):
        blockers.append(unknown)
    if blockers:  # topo -m and sysfs disagree, IB and RoCE mixed, a spec HCA the node lacks
        return {}, None, blockers
    if not rails.rails:
        return {"NCCL_IB_DISABLE": "1"}, None, []
    env = {"NCCL_IB_HCA": rails.hca_list}
    listed = {r.hca for r in rails.rails}
    if named and spec_hca is not None:  # UCX_NET_DEVICES follows it too
        env["NCCL_IB_HCA"] = spec_hca
        listed = {n for n in spec_hca.lstrip("=").split(",") if n}
    active = [p for p in ports if f"{p['device']}:{p['port']}" in listed or p["device"] in listed]
    roce = [p for p in active if p["link_layer"] == "Ethernet"]
    if not roce:
        return env, None, []
    indices = set()
    problems = []
    for port in roce:
        v2 = sorted(
            g["index"] for g in port["gids"] if g["type"] == "RoCE_v2" and _ipv4_mapped(g["gid"])
        )
        if v2:
            indices.add(v2[0])
        else:
            problems.append(
                f"{port['device']}:{port['port']} is RoCE but has no RoCE v2 GID with an IPv4 "
                "address"
            )
    if len(indices) > 1:
        problems.append(f"RoCE ports disagree on the RoCE v2 GID index ({sorted(indices)})")
    if len(indices) == 1:
        (index,) = indices
        env["NCCL_IB_GID_INDEX"] = str(index)
        return env, index, problems
    return env, None, problems


def _spec_hca(settings: dict[str, Any]) -> str | None:
    value = settings["env"].get("NCCL_IB_HCA")
    return None if value is None else str(value)


def derive(
    address: str,
    settings: dict[str, Any],
    interfaces: list[Interface],
    ports: list[IbPort],
    rails: Rails | None = None,
) -> Derived:
    """The node's NCCL/Gloo environment from its facts and its spec ``nccl`` settings
    (``rails``: the node's compute rails by GPU affinity, where it has such a source)."""
    result = Derived()
    existing = {i["name"] for i in interfaces}
    ifname = settings["socket_ifname"]
    if ifname == "auto":
        name, problem = cluster_interface(interfaces, address)
        if problem or name is None:  # cluster_interface gives a name or why there is none
            result.problems.append(problem or "no cluster interface")
        else:
            result.interface = name
            result.env["NCCL_SOCKET_IFNAME"] = f"={name}"  # '=': exactly eth0, not eth0.100
            result.env["GLOO_SOCKET_IFNAME"] = name  # Gloo takes exact names only
    else:
        names = [n for n in ifname.lstrip("^=").split(",") if n]
        if not ifname.startswith("^"):
            missing = [n for n in names if n not in existing]
            if missing:
                result.problems.append(
                    f"nccl.socket_ifname names {', '.join(missing)}, which this node does not "
                    f"have (it has {', '.join(sorted(existing))})"
                )
            result.env["GLOO_SOCKET_IFNAME"] = ",".join(names)
        result.env["NCCL_SOCKET_IFNAME"] = ifname
        result.interface = names[0] if names and not ifname.startswith("^") else None
    if settings["ib"] == "disable":
        result.env["NCCL_IB_DISABLE"] = "1"
    else:
        ib_env, result.gid_index, problems = ib_settings(ports, rails, spec_hca=_spec_hca(settings))
        result.env.update(ib_env)
        result.problems += problems
    result.network = cluster_network(interfaces, address)
    devices = ucx_devices(result.env, result.interface)
    if devices:
        result.env["UCX_NET_DEVICES"] = devices  # OpenMPI's UCX layer (pml ucx), same NICs as NCCL
    result.env.update({key: str(value) for key, value in settings["env"].items()})
    return result


def gid_disagreement(gid_by_node: dict[str, int | None]) -> str | None:
    """RoCE nodes must agree on NCCL_IB_GID_INDEX: launchers forward one node's value to all."""
    values = {node: index for node, index in gid_by_node.items() if index is not None}
    if len(set(values.values())) > 1:
        return "NCCL_IB_GID_INDEX differs between nodes: " + ", ".join(
            f"{n}={i}" for n, i in sorted(values.items())
        )
    return None


def derive_cluster(cluster: Cluster, networks: Mapping[str, Any]) -> dict[str, Derived]:
    """Every node whose network was read (``networks``: node -> NcclNetwork fact, or None),
    derived with the cross-node rules applied: RoCE nodes that disagree on the GID index
    get that as a problem. The deploy writes from this and drift expects this, so drift never
    expects files the deploy would refuse to write."""
    derived = {
        node.name: derive(
            node.address,
            node.nccl,
            networks[node.name]["interfaces"],
            networks[node.name]["ib_ports"],
        )
        for node in cluster.nodes
        if networks.get(node.name) is not None
    }
    disagreement = gid_disagreement({name: d.gid_index for name, d in derived.items()})
    if disagreement:
        for d in derived.values():
            if d.gid_index is not None:
                d.problems.append(disagreement)
    return derived


def checked_env(seen: Mapping[str, str], planned: Iterable[str]) -> dict[str, str]:
    """The variables of ``seen`` (what a shell sees) that a check compares with the plan: every
    one of the owned families, and those of the shared families that ``planned`` names."""
    named = set(planned)
    return {k: v for k, v in seen.items() if k.startswith(OWNED_PREFIXES) or k in named}


def uniform_variables(env_by_node: dict[str, dict[str, str]]) -> list[str]:
    """Variables with the same value on every node: safe for a launcher to forward (mpirun -x)."""
    envs = list(env_by_node.values())
    if not envs:
        return []
    return sorted(k for k in envs[0] if all(e.get(k) == envs[0][k] for e in envs))
