"""The bundles a run reads, one remote command per node each: what the deploy reads
(``DeployState``), what a converged node is checked on (``NodeFingerprint``) and the mesh's
live proof (``MeshProofs``); their sections come from the capabilities' registry, each
resolved to its fact by facts/fingerprint.py. ``plan_inputs`` turns what nodes answered into
the plan's ``Gathered``.
"""

from __future__ import annotations

from typing import Any

from pyinfra.api import StringCommand

from facts.fingerprint import FactBundle, ResolvedSections, resolve
from trainfleet.capabilities import CAPABILITIES, ssh_mesh
from trainfleet.defaults import SYSTEM_KNOWN_HOSTS
from trainfleet.plan_types import Gathered, WantedBlocks


def deploy_sections(users: list[str], blocks: WantedBlocks | None = None) -> ResolvedSections:
    """Every fact deploy/cluster.py's operations and the plan read, with the arguments they
    read it with: every capability's (``fact()`` refuses one not on it). ``blocks``: the
    planned cluster-wide blocks, answered by digest where a node holds them."""
    parts: ResolvedSections = {}
    for capability in CAPABILITIES:
        parts |= resolve(capability.deploy_sections(users, blocks or {}))
    return parts


def sections(
    users: list[str], peers: list[str], blocks: WantedBlocks | None = None
) -> ResolvedSections:
    """Everything a converged node is checked on: what the deploy reads, plus what only the
    checks read (the machine's identity, the NCCL variables as processes see them, a live
    probe of the SSH mesh)."""
    parts = deploy_sections(users, blocks)
    for capability in CAPABILITIES:
        parts |= resolve(capability.check_sections(users, peers))
    return parts


def mesh_proof_sections(users: list[str], peers: list[str]) -> ResolvedSections:
    """A live probe of every peer as each mesh user (drift's and the preflight's)."""
    return resolve(ssh_mesh.check_sections(users, peers))


def certificate_sections(users: list[str]) -> ResolvedSections:
    """The node's host certificates and each mesh user's certificate (the preflight's
    validity check)."""
    return {
        section: part
        for section, part in resolve(ssh_mesh.deploy_sections(users, {})).items()
        if section == "sshd_mesh" or section.startswith("mesh_user:")
    }


def plan_inputs(gathered: dict[str, Any]) -> Gathered:
    """What the plan needs of every node, from each node's sections (``deploy_sections`` or
    ``sections``; a node that could not be read gives nothing)."""
    readable = {node: found for node, found in gathered.items() if found}
    return Gathered(
        sections=readable,
        networks={node: found["network"] for node, found in readable.items()},
        host_keys={node: found["host_keys"] for node, found in readable.items()},
        os_families={node: found["stack"]["os"]["family"] for node, found in readable.items()},
        stacks={node: found["stack"] for node, found in readable.items()},
        npu_ips={node: found["npus"] for node, found in readable.items()},
        gpu_nodes={node: found["gpu_node"] for node, found in readable.items()},
        sshd={node: found["sshd_mesh"] for node, found in readable.items()},
        user_certificates={
            node: {
                key.split(":", 1)[1]: value["certificate"]
                for key, value in found.items()
                if key.startswith("mesh_user:")
            }
            for node, found in readable.items()
        },
        trust={
            node: {
                SYSTEM_KNOWN_HOSTS: found["known_hosts"]["block"],
                **{
                    key.split(":", 1)[1]: value["authorized"]["block"]
                    for key, value in found.items()
                    if key.startswith("mesh_user:")
                },
            }
            for node, found in readable.items()
        },
    )


class NodeFingerprint(FactBundle):
    """
    Everything convergence depends on, in one remote command: identity and hardware, the
    names, the SSH mesh (files and a live probe of every peer), pdsh, the network and the
    NCCL variables as non-login and login shells see them, the launcher files, the stack,
    OpenMPI and its parameter files.

    + users: the mesh users
    + peers: every node's name (the mesh probe's targets)
    + blocks: the planned cluster-wide blocks, by name (``trainfleet.plan.cluster_blocks``)

    .. code:: python

        {"identity": {...}, "hostname": {"running": "gpu-a01", "static": "gpu-a01"},
         "hosts": {"block": [...], ...}, "mesh_proof:root": {"gpu-a02": "ok"}, "stack": {...}, ...}
    """

    def parts(  # type: ignore[override]
        self, users: list[str], peers: list[str], blocks: WantedBlocks | None = None
    ) -> ResolvedSections:
        return sections(users, peers, blocks)

    def command(  # type: ignore[override]
        self, users: list[str], peers: list[str], blocks: WantedBlocks | None = None
    ) -> StringCommand:
        # pyinfra reads command()'s signature (getcallargs): the blocks come as one argument
        return super().command(users=users, peers=peers, blocks=blocks)


class MeshProofs(FactBundle):
    """
    The SSH mesh proved from this node as every mesh user, in one remote command:
    ``{"mesh_proof:<user>": {peer: "ok" | reason}}`` (see SshMeshProof), with the node's host
    and user certificates (``sshd_mesh``, ``mesh_user:<user>``) for their validity.

    + users: the mesh users
    + peers: every node's name
    """

    def parts(self, users: list[str], peers: list[str]) -> ResolvedSections:  # type: ignore[override]
        return {**mesh_proof_sections(users, peers), **certificate_sections(users)}

    def command(self, users: list[str], peers: list[str]) -> StringCommand:  # type: ignore[override]
        return super().command(users=users, peers=peers)


class DeployState(FactBundle):
    """
    Every fact deploy/cluster.py's operations read, in one remote command (what the node is
    before this run; pyinfra v3 reads facts before any change, so reading them at once is
    the same as reading them one by one).

    + users: the mesh users
    + blocks: the planned cluster-wide blocks, by name (``trainfleet.plan.cluster_blocks``)

    .. code:: python

        {"hostname": {...}, "hosts": {...}, "stack": {...}, "mesh_user:root": {...}, ...}
    """

    def parts(  # type: ignore[override]
        self, users: list[str], blocks: WantedBlocks | None = None
    ) -> ResolvedSections:
        return deploy_sections(users, blocks)

    def command(  # type: ignore[override]
        self, users: list[str], blocks: WantedBlocks | None = None
    ) -> StringCommand:
        return super().command(users=users, blocks=blocks)
