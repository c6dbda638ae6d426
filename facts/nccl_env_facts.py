"""Facts of the NCCL network environment: what the node's network offers, and what its
processes actually see."""

from __future__ import annotations

from typing import Any, TypedDict

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
from trainfleet.nccl import ENV_PREFIXES, ENV_PURPOSE, OWNED_PREFIXES, IbPort, Interface

# Interfaces with their addresses, bridges, and every InfiniBand/RoCE port with its GID
# table, from sysfs under $1 (a fixture tree in tests, /sys on nodes).
_NETWORK_SCRIPT = script("nccl_env_network.sh")

_FILES_SCRIPT = FILE_FN + script("nccl_env_files.sh")


class NcclNetworkT(TypedDict):
    interfaces: list[Interface]
    ib_ports: list[IbPort]


class NcclNetwork(FactBase[NcclNetworkT]):
    """
    What the node's network offers NCCL: interfaces with their addresses and MTU, bridges, and
    every InfiniBand/RoCE port with its state, link layer, GID table and active MTU
    (``ibv_devinfo``, where installed), in one command.

    + sysfs: the sysfs root (tests point it at fixture trees copied from real machines)

    .. code:: python

        {
            "interfaces": [{"name": "eth0", "addresses": ["198.18.0.11"],
                            "cidrs": ["198.18.0.11/24"], "bridge": False, "mtu": 9000}],
            "ib_ports": [{"device": "mlx5_0", "port": 1, "link_layer": "Ethernet",
                          "state": "4:ACTIVE",
                          "gids": [{"index": 3, "type": "RoCE_v2",
                                    "gid": "0000:...:ffff:c612:000b", "ndev": "ens1f0"}]}],
        }
    """

    def command(self, sysfs: str = "/sys") -> StringCommand:
        return shell(_NETWORK_SCRIPT, sysfs)

    def process(self, output: list[str]) -> NcclNetworkT:
        interfaces: dict[str, Interface] = {}
        ports: dict[tuple[str, int], IbPort] = {}
        active_mtu: dict[tuple[str, int], int] = {}
        for line in output:
            kind, *fields = line.split()
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
        return {"interfaces": list(interfaces.values()), "ib_ports": list(ports.values())}

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
