"""The cluster spec's schema: every key, its type, its default and what it means.

One table drives validation (``spec.py``) and the README's reference
(``python -m trainfleet schema``), so the two cannot disagree.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A check returns None when the value is fine, else a message saying what is wrong.
Check = Callable[[Any], "str | None"]

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$", re.IGNORECASE)


def hostname_problem(value: str) -> str | None:
    """RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens."""
    if len(value) > 253:
        return f"{value!r} is longer than 253 characters"
    if not all(_LABEL.match(label) for label in value.split(".")):
        return (
            f"{value!r} is not a valid hostname (RFC 1123: labels of 1-63 letters, "
            "digits and hyphens, not starting or ending with a hyphen)"
        )
    return None


def short_name_problem(value: str) -> str | None:
    if "." in value:
        return f"{value!r} must be a short name without dots (set cluster.domain for the FQDN)"
    return hostname_problem(value)


def address_problem(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IPv4 or IPv6 address"
    return None


def port_problem(value: int) -> str | None:
    return None if 1 <= value <= 65535 else f"{value} is not a TCP port (1-65535)"


def non_negative(value: int) -> str | None:
    return None if value >= 0 else f"must be 0 or more, got {value}"


def pattern(regex: str, example: str) -> Check:
    compiled = re.compile(regex)

    def check(value: str) -> str | None:
        if compiled.fullmatch(value):
            return None
        return f"{value!r} is not a valid version (expected the form {example!r})"

    return check


def ifname_problem(value: str) -> str | None:
    if value == "auto":
        return None
    names = value.lstrip("^=").split(",")
    if all(re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", n) for n in names):
        return None
    return f"{value!r} is not 'auto' or an interface name list (e.g. '=eth0')"


def nccl_env_problem(value: dict) -> str | None:
    for key, val in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"(NCCL|GLOO|TORCH|CUDA|UCX)_[A-Z0-9_]+", key):
            return f"{key!r} is not an NCCL_/GLOO_/TORCH_/CUDA_/UCX_ variable name"
        if not isinstance(val, (str, int)) or isinstance(val, bool):
            return f"{key}: value must be a string or integer, got {type(val).__name__}"
    return None


def tcp_include_problem(value: str) -> str | None:
    """`auto`, interface names (`eth0,eth1`) or IPv4 subnets (`198.18.0.0/24`), as OpenMPI takes them."""
    if value == "auto":
        return None
    for item in value.split(","):
        if "/" in item:
            try:
                ipaddress.IPv4Network(item)
            except ValueError as exc:
                return f"{item!r} is not a subnet in CIDR form ({exc})"
        elif not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", item):
            return f"{item!r} is not an interface name or a subnet (e.g. 'eth0' or '198.18.0.0/24')"
    return None


def mca_params_problem(value: dict) -> str | None:
    for key, val in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", key):
            return f"{key!r} is not an MCA parameter name (e.g. 'pml')"
        if key in ("btl_tcp_if_include", "oob_tcp_if_include"):
            return f"{key} is set by openmpi.tcp_include"
        if not isinstance(val, (str, int)) or isinstance(val, bool) or "\n" in str(val):
            return f"{key}: value must be a one-line string or integer"
    return None


@dataclass(frozen=True)
class Key:
    """One key of the spec: its type, default, optional extra check and documentation."""

    type: type | tuple[type, ...]
    default: Any
    doc: str
    check: Check | None = None
    required: bool = False
    items: type | None = None  # element type, for lists
    example: Any = None


@dataclass(frozen=True)
class Section:
    """A mapping of keys, documented as one table in the README."""

    keys: dict[str, Key | Section]
    doc: str


SSH = Section(
    doc="How the controller (and the SSH mesh) reaches a node. Per node, override any key.",
    keys={
        "user": Key(str, "root", "User pyinfra connects as (root: trainfleet writes /etc; sudo is not supported yet)."),
        "port": Key(int, 22, "sshd port of the node.", check=port_problem),
        "key": Key((str, type(None)), None, "Private key the controller uses (path); null: ssh-agent / default keys."),
        "known_hosts": Key(
            (str, type(None)), None,
            "known_hosts file the controller verifies host keys against; null: ~/.ssh/known_hosts. "
            "Host-key checking is never switched off.",
        ),
    },
)

NCCL = Section(
    doc="NCCL network environment. `auto` values are derived per node from its cluster address and sysfs.",
    keys={
        "socket_ifname": Key(str, "auto", "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; `auto` = the interface holding the node's address.", check=ifname_problem),
        "ib": Key(str, "auto", "`auto` (use active InfiniBand/RoCE ports, else disable) or `disable`.",
                  check=lambda v: None if v in ("auto", "disable") else f"{v!r} must be 'auto' or 'disable'"),
        "env": Key(dict, {}, "Extra variables passed through as given, e.g. `NCCL_DEBUG: WARN`.", check=nccl_env_problem,
                   example={"NCCL_DEBUG": "WARN"}),
    },
)

OPENMPI = Section(
    doc="OpenMPI's network, written to every mesh user's `~/.openmpi/mca-params.conf` and the mpirun line.",
    keys={
        "tcp_include": Key(str, "auto", "btl_tcp_if_include / oob_tcp_if_include; `auto` = the cluster interface's name if all "
                           "nodes share it, else the cluster subnets (CIDR).", check=tcp_include_problem, example="198.18.0.0/24"),
        "params": Key(dict, {}, "Extra MCA parameters, e.g. `pml: ucx` (Debian's system file disables UCX).",
                      check=mca_params_problem, example={"pml": "ucx"}),
    },
)

STACK = Section(
    doc="Pinned software stack; null leaves that component unmanaged. Every node gets exactly these.",
    keys={
        "cuda": Key((str, type(None)), None, "CUDA toolkit version.", check=pattern(r"\d+\.\d+(\.\d+)?", "12.4"), example="12.4"),
        "cudnn": Key((str, type(None)), None, "cuDNN version.", check=pattern(r"\d+(\.\d+){1,3}(-\d+(\+cuda\d+\.\d+)?)?", "9.1.0.70"), example="9.1.0.70"),
        "nccl": Key((str, type(None)), None, "NCCL version (libnccl2).", check=pattern(r"\d+\.\d+\.\d+(-\d+(\+cuda\d+\.\d+)?)?", "2.21.5-1"), example="2.21.5-1"),
        "torch": Key((str, type(None)), None, "PyTorch version in the node venv.", check=pattern(r"\d+\.\d+\.\d+(\+[a-z0-9]+)?", "2.4.1"), example="2.4.1"),
        "torch_cuda": Key((str, type(None)), None, "PyTorch CUDA variant (wheel index).", check=pattern(r"cu\d{3,4}|cpu", "cu124"), example="cu124"),
        "gcc": Key((str, type(None)), None, "GCC major version (devtoolset / gcc-toolset / gcc-N).", check=pattern(r"\d{1,2}", "11"), example="11"),
        "wheelhouse": Key((str, type(None)), None, "Directory on every node holding torch and its dependency wheels (air-gapped clusters); null: the variant's index.",
                          check=lambda v: None if v.startswith("/") else f"{v!r} must be an absolute path on the nodes"),
        "torch_index": Key((str, type(None)), None, "Mirror of the PyTorch wheel index; null: download.pytorch.org/whl/<torch_cuda>."),
        "cuda_repo": Key((str, type(None)), None, "Mirror of NVIDIA's CUDA repositories root; null: developer.download.nvidia.com."),
        "allow_change": Key(bool, False, "Let the deploy move a node whose installed CUDA/cuDNN/NCCL differs from the pins; false: such a node fails, unchanged."),
    },
)

CLUSTER = Section(
    doc="Cluster-wide settings.",
    keys={
        "name": Key((str, type(None)), None, "Cluster name, used in reports; null: the spec file's name."),
        "domain": Key((str, type(None)), None, "DNS domain: /etc/hosts gets `name.domain` beside `name`.", check=hostname_problem, example="cluster.example.com"),
        "mesh_users": Key(list, ["root"], "Users that get the passwordless SSH mesh.", items=str),
        "master_port": Key(int, 29500, "Rendezvous port of the master (first) node.", check=port_problem),
    },
)

NODE = Section(
    doc="One entry per server, in rank order: the first node is the master.",
    keys={
        "name": Key(str, None, "Short hostname the node gets (RFC 1123, unique).", check=short_name_problem, required=True, example="gpu-a01"),
        "address": Key(str, None, "Cluster address: where peers reach the node (unique).", check=address_problem, required=True, example="192.0.2.11"),
        "gpus": Key(int, 0, "GPUs in the node: launcher slots and processes per node.", check=non_negative, example=8),
        "ssh": SSH,
        "nccl": Section(doc="Per-node NCCL overrides (same keys as `nccl`).", keys=NCCL.keys),
    },
)

SPEC = Section(
    doc="The cluster spec.",
    keys={
        "cluster": CLUSTER,
        "ssh": SSH,
        "stack": STACK,
        "nccl": NCCL,
        "openmpi": OPENMPI,
        # `nodes` is a list of NODE sections; handled by the validator.
    },
)


def type_name(t: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", list: "list", dict: "mapping", bool: "boolean", type(None): "null"}
    if isinstance(t, tuple):
        return " or ".join(names.get(x, x.__name__) for x in t)
    return names.get(t, t.__name__)


def reference_markdown() -> str:
    """The README's spec reference, generated from the schema above."""
    out: list[str] = []

    def table(prefix: str, section: Section) -> None:
        out.append(f"`{prefix}`: {section.doc}\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        nested: list[tuple[str, Section]] = []
        for name, key in section.keys.items():
            if isinstance(key, Section):
                nested.append((f"{prefix}.{name}", key))
                out.append(f"| `{name}` | mapping | | see `{prefix}.{name}` |")
                continue
            default = "required" if key.required else f"`{json.dumps(key.default)}`"
            out.append(f"| `{name}` | {type_name(key.type)} | {default} | {key.doc} |")
        out.append("")
        for nested_prefix, sub in nested:
            table(nested_prefix, sub)

    for name, section in SPEC.keys.items():
        assert isinstance(section, Section)
        table(name, section)
    table("nodes[]", NODE)
    return "\n".join(out)
