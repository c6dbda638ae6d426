"""The plan's types, below every capability: what a plan part is built from (``Gathered``,
``PlanContext``), what it is held in (``Parts``, ``NodePlan``, ``ClusterPlan``), and the bundle's
section and block shapes. The capabilities fill them (``trainfleet.capabilities``), the plan loops
over the capabilities (``trainfleet.plan``); this module imports neither."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainfleet.key_material import KeyMaterial
from trainfleet.model import Cluster, Node

T = TypeVar("T")


@dataclass(frozen=True)
class Gathered:
    """The facts of every node the plan needs, ``node -> value``; a node missing was not read.

    + networks: the NcclNetwork fact (interfaces, InfiniBand ports)
    + host_keys: the node's SSH host keys; None when no host keys were gathered at all (the
      preflight's plan needs none), so no fallback to the controller's known_hosts is made
    + os_families: ``debian`` | ``rhel`` | ``unknown``
    + npu_ips: each node's Ascend device IPs (``/etc/hccn.conf``, ``hccn_tool``)
    + gpu_nodes: the GpuNodeState fact (driver, NVSwitches, persistence, peermem, memlock, clock)
    """

    networks: Mapping[str, Any] = field(default_factory=dict)
    host_keys: Mapping[str, list[str]] | None = None
    os_families: Mapping[str, str] = field(default_factory=dict)
    npu_ips: Mapping[str, Mapping[int, str]] = field(
        default_factory=dict
    )  # NpuDeviceIps: device id -> IP
    gpu_nodes: Mapping[str, Any] = field(default_factory=dict)
    sshd: Mapping[str, Any] = field(
        default_factory=dict
    )  # the SshdMesh fact: host certificates, drop-in, KRL
    user_certificates: Mapping[str, Mapping[str, str | None]] = field(
        default_factory=dict
    )  # node -> user -> line
    trust: Mapping[str, Mapping[str, list[str] | None]] = field(
        default_factory=dict
    )  # node -> known_hosts path | user -> block
    # the StackVersions fact: the OS and gcc the stack's files are rendered for
    stacks: Mapping[str, Any] = field(default_factory=dict)


class Parts(Mapping[str, Any]):
    """Values held by capability name, read as attributes (``plan.hosts``, ``shared.nccl_env``)
    or, typed, with ``get_as(name, kind)``. Filled once, while the plan is made."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def add(self, name: str, value: Any) -> None:
        if name in self._values:  # one part, one capability
            raise ValueError(f"{name} is planned twice")
        if hasattr(Parts, name) or name in ("node", "parts"):  # read as an attribute: no shadow
            raise ValueError(f"{name!r} would hide an attribute of the plan: name it otherwise")
        self._values[name] = value

    def __copy__(self) -> Parts:
        return Parts(self._values)

    def get_as(self, name: str, kind: type[T]) -> T:
        value = self._values[name]
        if not isinstance(value, kind):
            raise TypeError(f"{name} is a {type(value).__name__}, not a {kind.__name__}")
        return value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Parts({self._values!r})"


@dataclass(frozen=True)
class PlanContext:
    """What every node's plan parts are made of, built once per run: the cluster, the facts
    gathered, the key material, the nodes the last preflight left out, and each capability's
    cross-node part (``shared``, by capability name, filled in the registry's order: a
    capability's ``shared`` hook reads the parts of those listed before it)."""

    cluster: Cluster
    gathered: Gathered
    # the key store's snapshot as given (None plans no SSH mesh); the SSH mesh's shared part
    # holds it as the deploy's prepare_keys will leave it (MeshShared.keys): read that one
    keys: KeyMaterial | None = None
    excluded: Mapping[str, list[str]] = field(default_factory=dict)
    shared: Parts = field(default_factory=Parts)


@dataclass(frozen=True)
class NodePlan:
    """One node's plan: each capability's part by its name (``plan.hosts``, ``plan.nccl_env``,
    ``plan.ssh_mesh``...); a capability that plans nothing for a node has no part."""

    node: Node
    parts: Parts

    def __getattr__(self, name: str) -> Any:
        parts = self.__dict__.get("parts")
        if parts is None or name not in parts:
            raise AttributeError(name)
        return parts[name]


@dataclass(frozen=True)
class ClusterPlan:
    nodes: dict[str, NodePlan]
    notes: list[str]  # what a person should know about this run's plan (warnings)


# A capability's bundle sections: section -> (the fact's name in facts/fingerprint.py's FACTS,
# its arguments). The core names facts, it never imports them.
Sections = dict[str, tuple[str, dict[str, Any]]]
# The cluster-wide blocks the plan wants, known from the spec alone (each capability's
# ``blocks``, gathered by trainfleet.plan.cluster_blocks): a node holding one answers its digest.
# Empty: no expectation (every line comes back).
WantedBlocks = Mapping[str, list[str] | None]
