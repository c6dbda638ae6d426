"""Values of the right shape that most likely are not right: warnings, not refusals (#43).

``trainfleet check`` prints them (``--strict`` fails on them, as on a bad spec) and the front
door prints them before pyinfra runs. What cannot work at all is refused by the spec's own
validation (``spec.py``: a CUDA or torch release that never existed, a driver older than its CUDA
major needs, a master port below 1024, one node off the others' /24); what is here can run,
but not as the user most likely meant: a driver older than its toolkit's own, an address the
preflight cannot test, a controller file that is missing or lacks a node.

Pure: the validated cluster in, warnings out. The controller's own files that the spec names
(``ssh.key``, ``ssh.known_hosts``) are read; no host is contacted.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainfleet.driver_pins import driver_branch, driver_older, variant_cuda
from trainfleet.mesh import KnownHostsError, controller_known_keys, host_name
from trainfleet.model import Cluster, Node
from trainfleet.node_sets import fold


@dataclass(frozen=True)
class SpecWarning:
    key: str  # the spec key it is about: ``stack.driver``, ``nodes[gpu-a02].address``
    message: str  # what is wrong and why, one line

    def line(self, source: str) -> str:
        return f"{source}: warning: {self.key}: {self.message}"


# The driver each CUDA toolkit release ships with and is tested on (Linux x86_64): NVIDIA's
# CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions"
# (docs.nvidia.com/cuda/cuda-toolkit-release-notes, Table 3, "Toolkit Driver Version"), each
# minor's GA row. An older driver of the same major runs the toolkit only through minor version
# compatibility (docs.nvidia.com/deploy/cuda-compatibility, "Minor Version Compatibility":
# "with limited feature-set"): PTX the newer compiler emits does not JIT on it. The major's floor
# (driver_pins.MIN_DRIVER_FOR_CUDA) is refused by the spec; between the two, this warns.
TOOLKIT_DRIVER: Mapping[str, str] = MappingProxyType(
    {
        "11.0": "450.51.05", "11.1": "455.23", "11.2": "460.27.03", "11.3": "465.19.01",
        "11.4": "470.42.01", "11.5": "495.29.05", "11.6": "510.39.01", "11.7": "515.43.04",
        "11.8": "520.61.05",
        "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03", "12.3": "545.23.06",
        "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03", "12.8": "570.26",
        "12.9": "575.51.03",
        "13.0": "580.65.06",
    }
)  # fmt: skip

UNSUPPORTED_PTX = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"  # what a JIT of too new PTX fails with


def spec_warnings(cluster: Cluster) -> list[SpecWarning]:
    """Every warning of a validated cluster, in the spec's order of sections."""
    found: list[SpecWarning] = []
    for check in CHECKS:
        found += check(cluster)
    return found


def driver_warnings(cluster: Cluster) -> list[SpecWarning]:
    """A driver pin older than the driver of a CUDA it must run: the toolkit's (stack.cuda) and
    the one torch's wheels are built for (stack.torch_cuda)."""
    driver = cluster.stack.get("driver")
    if not driver or not cluster.uses_gpus:
        return []
    found = []
    for key, cuda in _cudas(cluster.stack):
        needed = TOOLKIT_DRIVER.get(cuda)
        if needed is None or not driver_older(driver, needed):
            continue
        found.append(
            SpecWarning(
                "stack.driver",
                f"driver {driver} is older than CUDA {cuda}'s own ({needed}, NVIDIA's release "
                f"notes; {key}): it runs CUDA {cuda} only through minor version compatibility, "
                "where PTX the newer compiler emits fails to load "
                f"({UNSUPPORTED_PTX}); pin {driver_branch(needed)} or newer, or accept that",
            )
        )
    return found


def _cudas(stack: Mapping[str, object]) -> list[tuple[str, str]]:
    """(the key, CUDA major.minor) of each CUDA the stack pins, each minor once."""
    found: dict[str, str] = {}
    cuda = stack.get("cuda")
    if isinstance(cuda, str):
        found.setdefault(".".join(cuda.split(".")[:2]), f"stack.cuda: {cuda}")
    variant = stack.get("torch_cuda")
    if isinstance(variant, str) and (minor := variant_cuda(variant)):
        found.setdefault(minor, f"stack.torch_cuda: {variant}")
    return [(key, minor) for minor, key in found.items()]


def torch_warnings(cluster: Cluster) -> list[SpecWarning]:
    """A torch build that cannot be what the spec means: a local label (``+cu121``) other than
    the variant whose index it is installed from, or the CPU build on nodes with GPUs."""
    torch, variant = cluster.stack.get("torch"), cluster.stack.get("torch_cuda")
    if not isinstance(torch, str):
        return []
    label = torch.partition("+")[2]
    found = []
    if label and variant and label != variant:
        found.append(
            SpecWarning(
                "stack.torch",
                f"{torch} is the {label} build, but stack.torch_cuda is {variant}: its index "
                f"has no {torch}; pin {torch.partition('+')[0]} (the {variant} build) or "
                f"torch_cuda: {label}",
            )
        )
    if (label or variant) == "cpu" and cluster.uses_gpus:
        found.append(
            SpecWarning(
                "stack.torch_cuda" if variant else "stack.torch",
                f"torch's CPU build on nodes with {cluster.total_gpus} GPUs: no job can use "
                "them (torch.cuda.is_available() is False); pin the CUDA variant they run "
                "(cu124)",
            )
        )
    return found


def address_warnings(cluster: Cluster) -> list[SpecWarning]:
    """Node addresses the preflight cannot test, or peers cannot reach."""
    found = []
    for node in cluster.nodes:
        why = _address_problem(ipaddress.ip_address(node.address), len(cluster.nodes))
        if why:
            found.append(SpecWarning(f"nodes[{node.name}].address", f"{node.address} {why}"))
    return found


def _address_problem(address: ipaddress.IPv4Address | ipaddress.IPv6Address, nodes: int) -> str:
    """Why a node's address cannot serve as a cluster address, or ''."""
    if nodes > 1 and (address.is_loopback or address.is_unspecified):
        return "is no address another node can reach (loopback or unspecified)"
    if address.is_multicast:
        return "is a multicast address: no host has it"
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_link_local:
            return (
                "is IPv6 link-local: it needs a scope id (an interface of one host) to be "
                "reached at all, and the preflight speaks IPv4"
            )
        return (
            "is IPv6: the preflight speaks IPv4 (its listeners, probes and name checks), so "
            "it cannot test this node; deploy and drift work (docs/preflight.md, The report)"
        )
    if nodes > 1 and address.is_link_local:
        return (
            "is IPv4 link-local (169.254.0.0/16: what a node gives itself when DHCP failed): "
            "not routed, reached only on one link"
        )
    return ""


def port_warnings(cluster: Cluster) -> list[SpecWarning]:
    """A master port the rendezvous cannot have: the master's sshd port, or too near 65535 for
    the preflight's pair ports after it (checks/pair_ports.py: master_port + 1 + index)."""
    found = []
    port = cluster.master_port
    if port == cluster.master.ssh["port"]:
        found.append(
            SpecWarning(
                "cluster.master_port",
                f"{port} is {cluster.master.name}'s sshd port (ssh.port): the rendezvous "
                "cannot listen there",
            )
        )
    if (last := port + (pair_ports := preflight_ports(cluster))) > 65535:
        found.append(
            SpecWarning(
                "cluster.master_port",
                f"the preflight's pair jobs take the {pair_ports} ports after "
                f"{port}, up to {last}, past 65535: pick a lower master_port",
            )
        )
    return found


def preflight_ports(cluster: Cluster) -> int:
    """How many ports after the master port the preflight's pair jobs may take: a port per
    bandwidth pair, per rail of each pair, and per isolation pair (checks/pair_ports.py; the
    unit tests hold the two equal)."""
    names = len(cluster.nodes)
    # the bandwidth stage's ring: one pair of two nodes, a pair per node from three
    pairs = names if names > 2 else 1 if names == 2 else int(cluster.master.slots > 1)
    declared = len(cluster.preflight.get("rails") or [])
    most = max(n.gpus for n in cluster.nodes) if cluster.uses_gpus else declared
    rails = most if most >= 2 and names > 1 else 0
    return max(pairs, pairs * rails, names - 1)


def preflight_warnings(cluster: Cluster) -> list[SpecWarning]:
    """A healthy subset size larger than the cluster: every subset is cut to nothing."""
    multiple = cluster.preflight.get("healthy_multiple_of")
    if isinstance(multiple, int) and multiple > len(cluster.nodes):
        return [
            SpecWarning(
                "preflight.healthy_multiple_of",
                f"{multiple} is more than the cluster's {len(cluster.nodes)} nodes: every "
                "healthy subset is cut to none",
            )
        ]
    return []


def ssh_file_warnings(cluster: Cluster) -> list[SpecWarning]:
    """The controller's files the spec names (``ssh.key``, ``ssh.known_hosts``): missing,
    unreadable, given relative to a folder pyinfra does not run in, not a private key, or a
    known_hosts without a node's host key (pyinfra refuses a host it has no key for)."""
    found = []
    for path, nodes in _named(cluster.nodes, "key").items():
        if why := _path_problem(path) or _key_problem(Path(path).expanduser()):
            found.append(SpecWarning(_key_name("key", nodes, cluster), f"{path} {why}"))
    for path, nodes in _named(cluster.nodes, "known_hosts").items():
        key = _key_name("known_hosts", nodes, cluster)
        if why := _path_problem(path):
            found.append(SpecWarning(key, f"{path} {why}"))
            continue
        found += [SpecWarning(key, f"{path} {why}") for why in _known_hosts_problems(path, nodes)]
    return found


def _named(nodes: Iterable[Node], key: str) -> dict[str, list[Node]]:
    """Each path the nodes' ``ssh.<key>`` names -> the nodes that use it."""
    found: dict[str, list[Node]] = {}
    for node in nodes:
        if node.ssh.get(key):
            found.setdefault(node.ssh[key], []).append(node)
    return found


def _key_name(key: str, nodes: list[Node], cluster: Cluster) -> str:
    if len(nodes) == len(cluster.nodes):
        return f"ssh.{key}"
    return f"nodes[{fold(n.name for n in nodes)}].ssh.{key}"


def _path_problem(path: str) -> str:
    expanded = Path(path).expanduser()
    if not expanded.is_absolute():
        return (
            "is relative: pyinfra reads it from the folder it runs in (the front door: the "
            "trainfleet checkout), not the spec's; give an absolute or ~/ path"
        )
    if not expanded.exists():
        return "does not exist on the controller"
    if not expanded.is_file():
        return "is not a file"
    return ""


# What a private key file starts with: OpenSSH's own format and the PEM ones paramiko reads.
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----")


def _key_problem(path: Path) -> str:
    """Why ``ssh.key`` is no private key the controller can use; its bytes are never shown."""
    try:
        with path.open("rb") as file:
            start = file.read(64)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if _PRIVATE_KEY.match(start):
        return ""
    if path.suffix == ".pub" or re.match(rb"(?:ssh|ecdsa|sk)-[a-z0-9@.-]+ ", start):
        return "is a public key: ssh.key names the private key (the file without .pub)"
    return "is not a private key (no -----BEGIN ... PRIVATE KEY----- line)"


def _known_hosts_problems(path: str, nodes: list[Node]) -> list[str]:
    """A known_hosts that cannot be read, and the nodes it lists no host key for, by the
    address and port pyinfra connects to (a name alone is not what it looks up)."""
    parsed: dict[Path, Any] = {}  # the file parsed once, whatever the cluster's size

    def has_key(host: str, node: Node) -> bool:
        return bool(controller_known_keys(host, node.ssh["port"], path, parsed))

    try:
        lacking = [n for n in nodes if not has_key(n.address, n)]
        by_name = [n for n in lacking if has_key(n.name, n)]
    except KnownHostsError as exc:
        return [f"cannot be read: {exc}"]
    except OSError as exc:
        return [f"cannot be read ({exc.strerror})"]
    if not lacking:
        return []
    listed = [f"{n.name} ({host_name(n.address, n.ssh['port'])})" for n in lacking[:5]]
    more = f" and {len(lacking) - 5} more" if len(lacking) > 5 else ""
    problem = (
        f"lists no host key for {', '.join(listed)}{more}: pyinfra refuses a host it has no "
        "key for (Host key verification failed); add each node's keys, checked out of band "
        "(docs/first-deploy.md)"
    )
    if by_name:
        problem += (
            f"; {fold(n.name for n in by_name)} listed by name only: pyinfra looks up the address"
        )
    return [problem]


CHECKS: tuple[Callable[[Cluster], list[SpecWarning]], ...] = (
    port_warnings,
    ssh_file_warnings,
    driver_warnings,
    torch_warnings,
    preflight_warnings,
    address_warnings,
)
