"""What every node must look like: one plan per node, plain data.

Built from the cluster model, the facts gathered once this run (each node's network, host
keys and OS family) and the key store. The deploy applies it (``deploy/cluster.py`` gives each
operation its part), drift compares what a node holds with it (``checks/drift_check.py``), the
preflight reads its names and NCCL environment. Every cross-node rule is applied here,
once; a part that cannot be planned carries its problems instead, and then the deploy fails
that node's step and drift expects nothing of it. No pyinfra here, no host touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainfleet import mesh
from trainfleet.capabilities import CAPABILITIES
from trainfleet.capabilities.gpu_node import GpuNodePlan
from trainfleet.capabilities.hosts import HostsPlan, hosts_lines, hosts_plan
from trainfleet.capabilities.launchers import LaunchersPlan, healthy_part, rank_table_part
from trainfleet.capabilities.nccl_env import NcclPlan, nccl_part
from trainfleet.capabilities.openmpi import MpiPlan, mpi_plan
from trainfleet.capabilities.pdsh import genders_lines
from trainfleet.capabilities.plan_context import Gathered, PlanContext
from trainfleet.capabilities.ssh_mesh import (
    MeshUserPlan,
    SshdPlan,
    client_problems,
    mesh_user_part,
    moving,
    revoked_host_key_problems,
    sshd_part,
)
from trainfleet.capabilities.stack import StackPlan, stack_part
from trainfleet.defaults import MESH_KEY_NAME, REVOKED_KEYS, SYSTEM_KNOWN_HOSTS
from trainfleet.key_material import KeyMaterial
from trainfleet.model import Cluster, Node
from trainfleet.nccl import derive_cluster, uniform_variables
from trainfleet.render import render_lines

# The plan parts, re-exported where operations and tests import them.
__all__ = [
    "ClusterPlan",
    "Gathered",
    "GpuNodePlan",
    "HostsPlan",
    "LaunchersPlan",
    "MeshUserPlan",
    "MpiPlan",
    "NcclPlan",
    "NodePlan",
    "SshdPlan",
    "StackPlan",
    "client_problems",
    "genders_lines",
    "mesh_user_part",
    "nccl_part",
    "plan_cluster",
    "rank_table_part",
    "revoked_host_key_problems",
    "sshd_part",
    "stack_part",
]


@dataclass(frozen=True)
class NodePlan:
    node: Node
    hostname: str
    hosts: HostsPlan
    known_hosts: list[str]
    mesh: list[MeshUserPlan]  # empty in a plan made without the key store
    sshd: SshdPlan | None  # None in a plan made without the key store
    pdsh_nodes: list[str]
    stack: StackPlan
    nccl: NcclPlan
    mpi: MpiPlan
    launchers: LaunchersPlan
    gpu: GpuNodePlan


@dataclass(frozen=True)
class ClusterPlan:
    nodes: dict[str, NodePlan]
    notes: list[str]  # what a person should know about this run's plan (warnings)


def cluster_blocks(cluster: Cluster) -> dict[str, list[str]]:
    """The cluster-wide blocks (a line per node) the plan wants on every node, known from the
    spec before any node is read: the bundles' arguments, so a node holding them answers a
    digest instead of N lines (facts/managed_block_facts.py ``tf_block``)."""
    names = [n.name for n in cluster.nodes]
    return {"hosts": hosts_lines(cluster), "genders": genders_lines(names), "machines": names}


def plan_cluster(
    cluster: Cluster,
    gathered: Gathered,
    keys: KeyMaterial | None = None,
    excluded: Mapping[str, list[str]] | None = None,
) -> ClusterPlan:
    """Every node's plan. Cluster-wide parts (hosts block, known hosts, authorized keys, ssh
    config, MCA parameters) are built once and shared by every node's plan. Writes nothing.

    + keys: the key store's snapshot (``KeyStore.snapshot``, or the deploy's ``prepare_keys``);
      None plans no SSH mesh (the preflight needs none)
    + excluded: the nodes the last preflight of each failed, with its causes
      (``trainfleet.stamps.exclusions``): left out of the healthy subset's launch files
    """
    notes: list[str] = []
    derived = derive_cluster(cluster, gathered.networks)
    interfaces = {d.interface for d in derived.values() if d.interface}
    if len(interfaces) > 1:
        notes.append(
            f"cluster interfaces differ between nodes ({', '.join(sorted(interfaces))}): "
            "each node gets its own, but DeepSpeed's and ColossalAI's runners forward "
            "the launching node's NCCL_SOCKET_IFNAME to every node"
        )
    known_hosts: list[str] = []
    if gathered.host_keys is not None and not (keys and cluster.mesh == "certificates"):
        host_keys, fallback = mesh.cluster_host_keys(cluster, gathered.host_keys)
        notes += [
            f"[{name}] not reachable: its host keys come from the controller's known_hosts "
            f"({len(host_keys[name])} found)"
            for name in fallback
        ]
        known_hosts = mesh.known_hosts_lines(cluster, host_keys)

    if keys and cluster.mesh == "certificates" and gathered.host_keys is not None:
        # A host key the CA vouched for that its node no longer presents (reimaged, removed
        # from the spec) keeps a valid certificate: the KRL must refuse it (the deploy's
        # prepare_keys recorded that already; drift expects it of the next deploy).
        seen = {name: found for name, found in gathered.host_keys.items() if found}
        keys = keys.presenting(
            seen, [n.name for n in cluster.nodes], mesh.unread_host_keys(cluster, seen)
        )
        if keys.ca_moving and keys.ca and mesh.settles(cluster, gathered, keys.ca.public, keys):
            keys = keys.settled()  # what the next deploy's prepare_keys does: drift expects it
    certs = (
        mesh.plan_certificates(cluster, keys) if keys and cluster.mesh == "certificates" else None
    )
    if certs:
        known_hosts = mesh.ca_known_hosts_lines(cluster, certs.ca_public)
    refused = (
        frozenset(" ".join(line.split()[:2]) for line in keys.revoked_keys())
        if keys
        else frozenset()
    )
    partial = not {n.name for n in cluster.nodes} <= set(gathered.sshd)  # nodes not read this run

    users = cluster.mesh_users
    if keys and cluster.mesh == "certificates":  # no CA yet: no line (the parts name it)
        authorized = {
            user: [mesh.ca_authorized_line(cluster, user, certs.ca_public)] if certs else []
            for user in users
        }
        groups = mesh.cluster_patterns(cluster, addresses=False)
        config = {
            user: render_lines(
                "ssh_mesh/ssh_config_patterns.j2",
                groups=groups,
                user=user,
                key_name=MESH_KEY_NAME,
                revoked_keys=REVOKED_KEYS,
            )
            for user in users
        }
    else:
        authorized = (
            {user: mesh.authorized_lines(cluster, user, keys) for user in users} if keys else {}
        )
        config = {
            user: render_lines(
                "ssh_mesh/ssh_config.j2", nodes=cluster.nodes, user=user, key_name=MESH_KEY_NAME
            )
            for user in users
        }
    users_moving = (
        {user: moving(cluster, gathered, user, authorized[user]) for user in users} if keys else {}
    )
    hosts_moving = moving(cluster, gathered, SYSTEM_KNOWN_HOSTS, known_hosts)
    mpi = mpi_plan(derived, cluster)
    healthy = healthy_part(cluster, excluded or {}, cluster.preflight.get("healthy_multiple_of"))
    uniform = uniform_variables({name: d.env for name, d in derived.items() if not d.problems})
    ctx = PlanContext(
        cluster=cluster,
        gathered=gathered,
        derived=derived,
        uniform=uniform,
        keys=keys,
        shared={
            "hosts": hosts_plan(cluster),
            "known_hosts": known_hosts,
            "certs": certs,
            "refused": refused,
            "partial": partial,
            "authorized": authorized,
            "config": config,
            "users_moving": users_moving,
            "hosts_moving": hosts_moving,
            "mpi": mpi,
            "pdsh_nodes": [n.name for n in cluster.nodes],
            "rank_table": rank_table_part(cluster, gathered.npu_ips),
            "healthy": healthy,
            # the subset's NPU nodes' rank table, once per run (none while nobody is left out)
            "healthy_rank_table": rank_table_part(healthy[0], gathered.npu_ips)
            if healthy[0] is not None and healthy[1]
            else (None, []),
        },
    )
    plans = {}
    for node in cluster.nodes:
        parts: dict[str, Any] = {}
        for capability in CAPABILITIES:
            part = capability.plan_part(ctx, node)
            if part.keys() & parts.keys():  # one attribute, one capability
                raise ValueError(
                    f"{capability.__name__} plans {sorted(part.keys() & parts.keys())}"
                )
            parts |= part
        plans[node.name] = NodePlan(**parts)
    return ClusterPlan(nodes=plans, notes=notes)
