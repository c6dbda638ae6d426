"""Facts of the NCCL network environment: what the node's network offers, and what its
processes actually see."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, NotRequired, TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import (
    FILE_FN,
    BlockState,
    block_state,
    file_line,
    file_text,
    read_file_lines,
    with_block_line,
    with_files,
)
from facts.shell import script, shell
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.hw.pci_tree import PCI_FUNCTION
from trainfleet.hw.sources import NETDEV
from trainfleet.nccl import ENV_PREFIXES, ENV_PURPOSE, OWNED_PREFIXES, IbPort, Interface

# Interfaces with their addresses, bridges, and every InfiniBand/RoCE port with its GID
# table, from sysfs under $1 (a fixture tree in tests, /sys on nodes).
_NETWORK_SCRIPT = script("nccl_env_network.sh")

_FILES_SCRIPT = FILE_FN + script("nccl_env_files.sh")


class ToolOutput(TypedDict):
    status: str  # "ok", "absent" (no such tool), "exit N" (124: timed out)
    text: str | None  # its whole output where ok


class NcclNetworkT(TypedDict):
    interfaces: list[Interface]
    ib_ports: list[IbPort]
    # raw, for the rails by GPU affinity and the RoCE QoS (#40); each value by its grammar
    hca_pci: NotRequired[dict[str, str]]  # HCA -> its PCI function, "0000:0c:00.0"
    traffic_class: NotRequired[dict[str, str]]  # HCA -> tc/1/traffic_class, "Global tclass=106"
    roce_tos: NotRequired[dict[str, int]]  # "mlx5_0:1" -> rdma_cm's default_roce_tos
    ecn: NotRequired[dict[str, dict[str, dict[int, int]]]]  # netdev -> np|rp -> prio -> 0|1
    qos: NotRequired[dict[str, ToolOutput]]  # RoCE netdev -> mlnx_qos -i <netdev>
    topo: NotRequired[ToolOutput]  # nvidia-smi topo -m ("absent" without nvidia-smi)
    refused: NotRequired[list[str]]  # lines whose values failed their grammar, named


_TOOL_STATUS = re.compile(r"absent|exit [0-9]{1,3}")
_HCA = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _tool(fields: list[str]) -> ToolOutput | None:
    """``ok BASE64``, ``absent`` or ``exit N`` (None: none of them)."""
    if len(fields) == 2 and fields[0] == "ok":
        try:
            text = base64.b64decode(fields[1], validate=True).decode("utf-8", "replace")
        except binascii.Error:
            return None
        return {"status": "ok", "text": text}
    if fields == ["ok"]:  # the tool printed nothing
        return {"status": "ok", "text": ""}
    if _TOOL_STATUS.fullmatch(" ".join(fields)):
        return {"status": " ".join(fields), "text": None}
    return None


def _fabric_line(kind: str, fields: list[str], line: str, into: dict[str, Any]) -> bool:
    """One of the fabric's lines read into ``into`` (False: not one of its kinds). A value that
    fails its grammar is named in ``refused``, never used."""
    ok = False
    if kind == "pci" and len(fields) == 2:
        ok = bool(_HCA.fullmatch(fields[0]) and PCI_FUNCTION.fullmatch(fields[1]))
        if ok:
            into.setdefault("hca_pci", {})[fields[0]] = fields[1]
    elif kind == "tc" and len(fields) >= 2:
        ok = bool(_HCA.fullmatch(fields[0]))
        if ok:
            into.setdefault("traffic_class", {})[fields[0]] = " ".join(fields[1:])
    elif kind == "tos" and len(fields) == 3:
        ok = bool(_HCA.fullmatch(fields[0]) and fields[1].isdigit() and fields[2].isdigit())
        if ok:
            into.setdefault("roce_tos", {})[f"{fields[0]}:{int(fields[1])}"] = int(fields[2])
    elif kind == "ecn" and len(fields) == 4:
        netdev, which, prio, value = fields
        ok = bool(NETDEV.fullmatch(netdev)) and which in ("np", "rp")
        ok = ok and prio in "01234567" and len(prio) == 1 and value in ("0", "1")
        if ok:
            by_prio = into.setdefault("ecn", {}).setdefault(netdev, {}).setdefault(which, {})
            by_prio[int(prio)] = int(value)
    elif kind == "qos" and fields:
        found = _tool(fields[1:])
        ok = bool(NETDEV.fullmatch(fields[0])) and found is not None
        if ok and found is not None:
            into.setdefault("qos", {})[fields[0]] = found
    elif kind == "topo":
        found = _tool(fields)
        ok = found is not None
        if found is not None:
            into["topo"] = found
    else:
        return False
    if not ok:
        into.setdefault("refused", []).append(f"{kind}: {line[:80]!r}")
    return True


class NcclNetwork(FactBase[NcclNetworkT]):
    """
    What the node's network offers NCCL: interfaces with their addresses and MTU, bridges,
    every InfiniBand/RoCE port with its state, link layer, GID table and active MTU
    (``ibv_devinfo``, where installed), and, raw, what decides the rails and the RoCE QoS: each
    HCA's PCI function, its global traffic class, rdma_cm's ToS, each RoCE netdev's ECN
    enables and ``mlnx_qos -i`` (bounded), and ``nvidia-smi topo -m`` (bounded), in one
    command. Nothing is set: configfs is read only where its folder exists.

    + sysfs: the sysfs root (tests point it at fixture trees copied from real machines)

    .. code:: python

        {
            "interfaces": [{"name": "eth0", "addresses": ["198.18.0.11"],
                            "cidrs": ["198.18.0.11/24"], "bridge": False, "mtu": 9000}],
            "ib_ports": [{"device": "mlx5_0", "port": 1, "link_layer": "Ethernet",
                          "state": "4:ACTIVE",
                          "gids": [{"index": 3, "type": "RoCE_v2",
                                    "gid": "0000:...:ffff:c612:000b", "ndev": "ens1f0"}]}],
            "hca_pci": {"mlx5_0": "0000:0c:00.0"},
            "traffic_class": {"mlx5_0": "Global tclass=106"},
            "roce_tos": {"mlx5_0:1": 106},
            "ecn": {"ens1f0": {"np": {3: 1, ...}, "rp": {3: 1, ...}}},
            "qos": {"ens1f0": {"status": "ok", "text": "DCBX mode: OS controlled..."}},
            "topo": {"status": "absent", "text": None},
        }
    """

    def command(self, sysfs: str = "/sys") -> StringCommand:
        return shell(_NETWORK_SCRIPT, sysfs)

    def process(self, output: list[str]) -> NcclNetworkT:
        interfaces: dict[str, Interface] = {}
        ports: dict[tuple[str, int], IbPort] = {}
        active_mtu: dict[tuple[str, int], int] = {}
        fabric: dict[str, Any] = {}
        for line in output:
            kind, *fields = line.split()
            if _fabric_line(kind, fields, line, fabric):
                continue
            if kind == "addr" and len(fields) >= 3:
                iface = interfaces.setdefault(
                    fields[0], {"name": fields[0], "addresses": [], "bridge": False}
                )
                iface["addresses"].append(fields[2].split("/")[0])
                iface.setdefault("cidrs", []).append(fields[2])
            elif kind == "mtu" and len(fields) == 2 and fields[1].isdigit():
                interfaces.setdefault(
                    fields[0], {"name": fields[0], "addresses": [], "bridge": False}
                )["mtu"] = int(fields[1])
            elif (
                kind == "ibmtu" and len(fields) == 3 and fields[1].isdigit() and fields[2].isdigit()
            ):
                active_mtu[(fields[0], int(fields[1]))] = int(fields[2])
            elif kind == "bridge":
                interfaces.setdefault(
                    fields[0], {"name": fields[0], "addresses": [], "bridge": False}
                )["bridge"] = True
            elif kind == "port" and len(fields) >= 3:
                ports[(fields[0], int(fields[1]))] = {
                    "device": fields[0],
                    "port": int(fields[1]),
                    "link_layer": fields[2],
                    "state": fields[3] if len(fields) > 3 else "",
                    "gids": [],
                }
            elif kind == "gid" and len(fields) >= 5 and (fields[0], int(fields[1])) in ports:
                ports[(fields[0], int(fields[1]))]["gids"].append(
                    {
                        "index": int(fields[2]),
                        "type": fields[3],
                        "gid": fields[4],
                        "ndev": fields[5] if len(fields) > 5 else None,
                    }
                )

        for key, mtu in active_mtu.items():
            if key in ports:
                ports[key]["active_mtu"] = mtu
        # interfaces that only had an MTU line (no address, no bridge) are still interfaces
        return {
            "interfaces": list(interfaces.values()),
            "ib_ports": list(ports.values()),
            **fabric,  # type: ignore[typeddict-item]
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the script prints on a node whose network is ``value`` (``recorded``: the
        node's own, for what ``value`` leaves out): each interface's addresses (``ip -o addr``),
        bridge and MTU (sysfs), each port's state and GIDs, and its active MTU (ibv_devinfo)."""
        state = {**self.process(recorded), **value}
        lines = []
        for iface in state["interfaces"]:
            name = iface["name"]
            lines += [
                f"addr {name} {'inet6' if ':' in cidr else 'inet'} {cidr}"
                for cidr in iface.get("cidrs", [])
            ]
            lines += [f"bridge {name}"] if iface.get("bridge") else []
            lines += [f"mtu {name} {iface['mtu']}"] if "mtu" in iface else []
            if not iface.get("cidrs") and not iface.get("bridge") and "mtu" not in iface:
                raise ValueError(f"{name}: an interface the script prints nothing for")
        for port in state["ib_ports"]:
            at = f"{port['device']} {port['port']}"
            lines.append(f"port {at} {port['link_layer']} {port['state']}".rstrip(" "))
            lines += [
                f"gid {at} {gid['index']} {gid['type']} {gid['gid']} {gid['ndev'] or ''}".rstrip()
                for gid in port["gids"]
            ]
            lines += [f"ibmtu {at} {port['active_mtu']}"] if "active_mtu" in port else []
        return lines + _fabric_answer(state)


def _tool_answer(found: ToolOutput) -> str:
    if found["status"] != "ok":
        return found["status"]
    return f"ok {base64.b64encode((found['text'] or '').encode()).decode()}".rstrip()


def _fabric_answer(state: dict[str, Any]) -> list[str]:
    """The fabric's lines the script prints for ``state`` (NcclNetwork.answer)."""
    lines = [f"pci {hca} {pci}" for hca, pci in state.get("hca_pci", {}).items()]
    lines += [f"tc {hca} {value}" for hca, value in state.get("traffic_class", {}).items()]
    for at, tos in state.get("roce_tos", {}).items():
        hca, _, port = at.rpartition(":")
        lines.append(f"tos {hca} {port} {tos}")
    for netdev, kinds in state.get("ecn", {}).items():
        lines += [
            f"ecn {netdev} {which} {prio} {on}"
            for which, prios in kinds.items()
            for prio, on in prios.items()
        ]
    lines += [f"qos {n} {_tool_answer(found)}" for n, found in state.get("qos", {}).items()]
    if "topo" in state:
        lines.append(f"topo {_tool_answer(state['topo'])}")
    return lines


class NcclEnvFilesT(TypedDict):
    profile: str | None
    environment: BlockState
    nccl_conf: BlockState


class NcclEnvFiles(FactBase[NcclEnvFilesT]):
    """
    trainfleet's NCCL environment files on the node, in one command: the profile.d file
    (None when absent) and the managed blocks of /etc/environment and /etc/nccl.conf.

    .. code:: python

        {"profile": "# Written by trainfleet...\\nexport NCCL_SOCKET_IFNAME==eth0\\n",
         "environment": {"exists": True, "block": ["NCCL_SOCKET_IFNAME==eth0"], ...},
         "nccl_conf": {"exists": False, "block": None, "outside": [], "broken": None}}
    """

    def command(self) -> StringCommand:
        return shell(_FILES_SCRIPT, NCCL_PROFILE, NCCL_ENVIRONMENT, NCCL_CONF)

    def process(self, output: list[str]) -> NcclEnvFilesT:
        files = read_file_lines(output)
        return {
            "profile": file_text(files.get(NCCL_PROFILE)),
            "environment": block_state(files.get(NCCL_ENVIRONMENT), ENV_PURPOSE),
            "nccl_conf": block_state(files.get(NCCL_CONF), ENV_PURPOSE),
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What a node answers once ``value``'s profile and blocks are written in the files
        ``recorded`` holds (the controller benchmark's converged node)."""

        def block(key: str) -> Any:
            return lambda line: [with_block_line(line, ENV_PURPOSE, value[key]["block"])]

        return with_files(
            recorded,
            {
                NCCL_PROFILE: lambda line: [file_line(NCCL_PROFILE, value["profile"])],
                NCCL_ENVIRONMENT: block("environment"),
                NCCL_CONF: block("nccl_conf"),
            },
        )


_SEEN_SCRIPT = script("nccl_env_seen.sh")


class NcclEnvSeenT(TypedDict):
    non_login: dict[str, str]
    login: dict[str, str]


class NcclEnvSeen(FactBase[NcclEnvSeenT]):
    """
    The variables of the families ``nccl.env`` may set (trainfleet.nccl.ENV_PREFIXES) as
    processes see them: in the non-login shell an ``ssh node CMD`` gets (what pdsh, mpirun and
    DeepSpeed's runner start) and in a login shell. Which of them a check compares is the
    core's (``trainfleet.nccl.checked_env``).

    .. code:: python

        {"non_login": {"NCCL_SOCKET_IFNAME": "=eth0"}, "login": {"NCCL_SOCKET_IFNAME": "=eth0"}}
    """

    def command(self) -> str:
        return _SEEN_SCRIPT

    def process(self, output: list[str]) -> NcclEnvSeenT:
        seen: NcclEnvSeenT = {"non_login": {}, "login": {}}
        target: dict[str, str] | None = None
        for line in output:
            if line == "@non-login":
                target = seen["non_login"]
            elif line == "@login":
                target = seen["login"]
            elif target is not None and line.startswith(ENV_PREFIXES) and "=" in line:
                key, value = line.split("=", 1)
                target[key] = value
        return seen

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the script prints where each shell sees ``value``'s variables (sorted), the
        rest of ``recorded``'s environment kept (the controller benchmark's converged node): a
        recorded variable of an owned family, or one ``value`` names, is replaced."""
        seen = {"@non-login": value["non_login"], "@login": value["login"]}
        named = {k for env in seen.values() for k in env}
        out: list[str] = []
        for line in recorded:
            if line in seen:
                out += [line, *(f"{k}={v}" for k, v in sorted(seen[line].items()))]
            elif not (line.startswith(OWNED_PREFIXES) or line.partition("=")[0] in named):
                out.append(line)
        return out
