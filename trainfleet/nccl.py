"""Deriving each node's NCCL network environment from what its network offers.

Plain functions over the NcclNetwork fact's data, testable without any host:
- the socket interface is the one that holds the node's cluster address (never a
  guess by name or order, which is how NCCL ends up on an unreachable second NIC);
- InfiniBand/RoCE comes from sysfs: the compute rails become NCCL_IB_HCA (trainfleet.rails:
  the ports under a GPU's PCIe switch where nvidia-smi topo -m is known, ``network_rails``,
  else every active port; never InfiniBand and RoCE mixed), RoCE v2 picks NCCL_IB_GID_INDEX,
  no rail disables IB;
- spec values override derived ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_interface
from typing import Any, NotRequired, TypedDict

from trainfleet.hw import topo
from trainfleet.nccl_gids import (
    AF_INET,
    AF_INET6,
    families,
    nccl_pick,
    own_pick,
    picks_itself,
    release_text,
)
from trainfleet.rails import HcaPort, Rails, by_affinity, without_affinity

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
    release: tuple[int, int] | None = None  # the NCCL whose GID rule applied (None: unknown)
    # the host's QoS on its RoCE rails (trainfleet.nccl_qos): the values the majority compares
    # (trust, PFC priority, traffic class) and what is wrong with it (lossy RoCE, a TC that
    # misses the PFC priority); a finding on the fabric, never a reason not to write the env
    qos: dict[str, str] = field(default_factory=dict)
    qos_problems: list[str] = field(default_factory=list)


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


def fact_ports(ports: list[IbPort]) -> list[HcaPort]:
    """The NcclNetwork fact's ports as the rails rule reads them (the fact reads no rate)."""
    return [HcaPort(p["device"], p["port"], p["link_layer"], p["state"]) for p in ports]


def network_rails(network: Mapping[str, Any]) -> Rails | None:
    """The node's compute rails from its NcclNetwork fact, as ``trainfleet diagnose`` derives
    them from a capture: by GPU affinity where ``nvidia-smi topo -m`` was read (its NIC legend
    names the HCAs, the ports are the fact's); a topo -m that cannot be read stands in the
    way, named (never a guess); None without nvidia-smi (every active port, ib_settings)."""
    found = network.get("topo")
    if not found or found["status"] == "absent":
        return None
    ports = fact_ports(network["ib_ports"])
    if found["status"] != "ok":
        why = f"nvidia-smi topo -m failed ({found['status']})"
        return Rails((), {}, (why,), by_affinity=True)
    try:
        return by_affinity(topo.parse(found["text"] or ""), ports)
    except topo.TopoRefused as exc:
        return Rails((), {}, (f"nvidia-smi topo -m refused: {exc}",), by_affinity=True)


def hca_list(value: str) -> list[str]:
    """NCCL_IB_HCA's entries in order (``mlx5_4``, ``mlx5_4:1``), without the ``=`` that makes
    them exact names rather than prefixes; a ``^`` (an exclusion list) stays on the first."""
    return [entry for entry in value.removeprefix("=").split(",") if entry]


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

    missing = [e for e in hca_list(spec_hca) if not present(e)]
    if not missing:
        return None
    have = ", ".join(f"{p['device']}:{p['port']}" for p in ports) or "no InfiniBand/RoCE port"
    return (
        f"nccl.env NCCL_IB_HCA names {', '.join(missing)}, which this node does not have "
        f"(it has {have})"
    )


def ib_settings(
    ports: list[IbPort],
    rails: Rails | None = None,
    spec_hca: str | None = None,
    release: tuple[int, int] | None = None,
    spec_env: Mapping[str, Any] | None = None,
) -> tuple[dict[str, str], int | None, list[str]]:
    """NCCL_IB_* for the node's compute rails (``rails``: by GPU affinity where the node has
    such a source, else every active port): (env, the GID index pinned cluster-wide, problems).
    Rails that mix link layers are a problem unless the spec names the HCAs (``spec_hca``: its
    NCCL_IB_HCA, which then also decides whose GIDs count). The GID settings follow the NCCL
    ``release`` that will run (trainfleet.nccl_gids; None: unknown, treated as older than 2.21)."""
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
    if picks_itself(release):
        gid_env, problems = nccl_picks_gid(roce, spec_env or {})
        return {**env, **gid_env}, None, problems
    index, problems = pinned_gid_index(roce, release)
    if index is not None:
        env["NCCL_IB_GID_INDEX"] = str(index)
    return env, index, problems


def _name(port: IbPort) -> str:
    return f"{port['device']}:{port['port']}"


def pinned_gid_index(
    roce: list[IbPort], release: tuple[int, int] | None
) -> tuple[int | None, list[str]]:
    """NCCL before 2.21 (or unknown) uses the index it is given: the RoCE v2 GID with an IPv4
    address (on the port's own netdev where one address is on two), one index for every port."""
    indices = set()
    problems = []
    for port in roce:
        pick = own_pick(port["gids"], AF_INET)
        if pick is not None:
            indices.add(int(pick["index"]))
        elif families(port["gids"]) == [AF_INET6]:
            problems.append(
                f"{_name(port)} is RoCE with IPv6 RoCE v2 GIDs only: NCCL "
                f"{release_text(release)} (not known to be 2.21 or later) uses the GID index "
                "it is given and trainfleet pins only an IPv4 one; pin stack.nccl to 2.21 or "
                "later, where NCCL picks the IPv6 GID itself (NCCL_IB_ADDR_FAMILY=AF_INET6)"
            )
        else:
            problems.append(f"{_name(port)} is RoCE but has no RoCE v2 GID with an IPv4 address")
    if len(indices) > 1:
        problems.append(f"RoCE ports disagree on the RoCE v2 GID index ({sorted(indices)})")
    return (indices.pop() if len(indices) == 1 else None), problems


def nccl_picks_gid(
    roce: list[IbPort], spec_env: Mapping[str, Any]
) -> tuple[dict[str, str], list[str]]:
    """NCCL 2.21 or later picks each port's GID itself: RoCE v2, of the address family every
    port has a routable v2 GID of (IPv4 first; the spec's NCCL_IB_ADDR_FAMILY where given),
    inside the spec's NCCL_IB_ADDR_RANGE. An index is pinned only where NCCL's own pick (the
    lowest index) is another netdev's GID of the same address (a VXLAN over the bond)."""
    address_range = spec_env.get("NCCL_IB_ADDR_RANGE")
    address_range = None if address_range is None else str(address_range)
    wanted = spec_env.get("NCCL_IB_ADDR_FAMILY")
    offered = {_name(p): families(p["gids"], address_range) for p in roce}
    common = [af for af in (AF_INET, AF_INET6) if all(af in f for f in offered.values())]
    if wanted is not None:
        common = [af for af in common if af == str(wanted)]
    if not common:
        have = ", ".join(f"{n}={'/'.join(f) or 'none'}" for n, f in offered.items())
        where = f" inside NCCL_IB_ADDR_RANGE {address_range}" if address_range else ""
        return {}, [
            f"RoCE ports have no address family of routable RoCE v2 GIDs{where} in common"
            f"{f' with NCCL_IB_ADDR_FAMILY {wanted}' if wanted is not None else ''} "
            f"(families with a non-link-local v2 GID: {have})"
        ]
    af = common[0]
    env = {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": af}
    owned = {_name(p): own_pick(p["gids"], af, address_range) for p in roce}
    moved = [p for p in roce if nccl_pick(p["gids"], af, address_range) != owned[_name(p)]]
    if not moved:
        return env, []
    indices = {int(g["index"]) for g in owned.values() if g is not None}
    if len(indices) > 1:
        return env, [
            f"{', '.join(_name(p) for p in moved)}: NCCL would take another netdev's GID of "
            f"the port's address, and the ports' own GIDs are at different indices "
            f"({sorted(indices)}), so no one NCCL_IB_GID_INDEX fits"
        ]
    return {**env, "NCCL_IB_GID_INDEX": str(indices.pop())}, []


def _spec_hca(settings: dict[str, Any]) -> str | None:
    value = settings["env"].get("NCCL_IB_HCA")
    return None if value is None else str(value)


def derive(
    address: str,
    settings: dict[str, Any],
    interfaces: list[Interface],
    ports: list[IbPort],
    rails: Rails | None = None,
    release: tuple[int, int] | None = None,
) -> Derived:
    """The node's NCCL/Gloo environment from its facts and its spec ``nccl`` settings
    (``rails``: the node's compute rails by GPU affinity, where it has such a source;
    ``release``: the NCCL that will run there, trainfleet.nccl_gids.deciding_release)."""
    result = Derived(release=release)
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
        ib_env, result.gid_index, problems = ib_settings(
            ports, rails, _spec_hca(settings), release, settings["env"]
        )
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
