"""What every capability's plan part is built from: the facts gathered once this run and the
values shared by every node, computed once per run by ``trainfleet.plan.plan_cluster``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfleet.model import Cluster
from trainfleet.nccl import Derived


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


@dataclass(frozen=True)
class PlanContext:
    """Everything a node's plan parts are made of, built once per run: the cluster, the facts
    gathered, the derived NCCL environment, the key material and the cluster-wide blocks."""

    cluster: Cluster
    gathered: Gathered
    derived: Mapping[str, Derived]  # node -> its derived NCCL environment
    uniform: Sequence[str]  # names of NCCL variables alike on every node (launchers forward)
    keys: Any  # the key material; None plans no SSH mesh
    # every cluster-wide part, rendered once: name -> value (``hosts``, ``known_hosts``,
    # ``authorized``, ``config``, ``certs``, ``mpi``, ``rank_table``...), read by the capabilities
    shared: Mapping[str, Any] = field(default_factory=dict)
    # launcher files every node shares, rendered once (filled as nodes are planned)
    shared_files: dict[tuple[Any, ...], str] = field(default_factory=dict)


# A capability's bundle sections: section -> (the fact's name in facts/fingerprint.py's FACTS,
# its arguments). The core names facts, it never imports them.
Sections = dict[str, tuple[str, dict[str, Any]]]
# The cluster-wide blocks the plan wants, known from the spec alone
# (trainfleet.plan.cluster_blocks): a node holding one answers its digest. Empty: no
# expectation (every line comes back).
Blocks = Mapping[str, list[str] | None]
