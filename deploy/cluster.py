"""The cluster, capability by capability: ``trainfleet deploy SPEC`` (or ``pyinfra
inventories/prod.py deploy/cluster.py``). A step the spec's ``manage`` turns off does not run
(its part of the plan is still made: drift and the other parts read it).

Each step is one capability given its part of the node's plan (trainfleet/plan.py); its
operations live in operations/<capability>_ops.py, its facts in facts/<capability>_facts.py,
its templates in templates/<capability>/.
"""

from typing import Any

from operations import (
    gpu_node_ops,
    hosts_ops,
    launchers_ops,
    nccl_env_ops,
    openmpi_ops,
    pdsh_ops,
    ssh_mesh_ops,
    stack_ops,
)
from runtime.gather import (
    HomeIntact,
    a_mesh_user_step_failed,
    a_root_step_failed,
    deploy_plan,
    mesh_users_begin,
    no_host_failed,
    no_root_step_failed,
    this_node,
    whole_cluster_healthy,
    whole_cluster_root_steps_healthy,
)
from trainfleet.capabilities.ssh_mesh import MeshUserPlan, SshMeshPlan


def user_joins_the_mesh(
    user: MeshUserPlan, trust_if: Any, mesh_if: Any, in_their_home: bool
) -> None:
    """A mesh user's first two steps: the mesh's new lines trusted beside the old, then its
    key, config and certificate. A step in a user's home fails no node (``in_their_home``)."""
    ssh_mesh_ops.mesh_trust(
        name=f"{user.user} also trusts the mesh's new lines",
        user=user.user,
        authorized=user.authorized,
        refused=user.refused,
        exactly=False,
        _if=trust_if,
        _ignore_errors=in_their_home,
    )
    ssh_mesh_ops.mesh_user(
        name=f"SSH mesh for {user.user}",
        user=user.user,
        identity=user.identity,
        config=user.config,
        certificate=user.certificate,
        problems=user.problems,
        _if=mesh_if,
        _ignore_errors=in_their_home,
    )


def user_trusts_exactly_the_mesh(user: MeshUserPlan, trust_if: Any, in_their_home: bool) -> None:
    ssh_mesh_ops.mesh_trust(
        name=f"{user.user} trusts exactly the mesh",
        user=user.user,
        authorized=user.authorized,
        certificate=user.certificate,
        refused=user.refused,
        _if=trust_if,
        _ignore_errors=in_their_home,
    )


# SSH mesh: every node reaches every node as each mesh user, host keys verified. In a
# certificate mesh (ssh.mesh) the cluster CA vouches for hosts and users, one line on every
# node. pyinfra runs each operation on every node before the next one starts, so a mesh that
# moves (keys <-> certificates, a new CA) first trusts the old way and the new everywhere;
# then nodes change what they present (while moving: only if no node failed its trust step);
# then, only in a run that reached every node without a failure, the old trust is dropped,
# a few seconds later (MESH_MOVE_GRACE_SECONDS): a login under way finishes under it first.
# A revoked key goes at once. Each user's steps come before the next user's. The root-owned
# steps (known_hosts, sshd, root's own files) come first, their old trust dropped before any
# step in another mesh user's home, which that user can make fail every run: such a failure
# costs that user's later steps on its own node only (the other nodes and users move and drop
# old trust without it, its node's KRL still takes every revocation), then fails its node.


def ssh_mesh_steps(mesh: SshMeshPlan) -> None:
    ssh_mesh_ops.known_hosts(
        name="known_hosts also trusts the cluster's new host lines",
        entries=mesh.known_hosts,
        exactly=False,
    )
    if (
        mesh.sshd.drop_in is not None or mesh.sshd.problems
    ):  # a node that cannot present certificates fails here
        ssh_mesh_ops.sshd_certificates(
            name="sshd presents its host certificates, refuses revoked keys",
            certificates=mesh.sshd.certificates,
            drop_in=mesh.sshd.drop_in,
            revoked_keys=mesh.sshd.revoked_keys,
            problems=mesh.sshd.problems,
            client_drop_in=mesh.sshd.client_drop_in,
            _if=no_host_failed if mesh.sshd.moving else None,
        )
    root_owned = [user for user in mesh.users if user.user == "root"]
    in_user_homes = [user for user in mesh.users if user.user != "root"]

    for user in root_owned:
        user_joins_the_mesh(
            user, None, no_host_failed if user.moving else None, in_their_home=False
        )
    if mesh.moving:
        ssh_mesh_ops.logins_under_way_finish(
            name="Logins under way finish before the old trust goes", _if=whole_cluster_healthy
        )
    ssh_mesh_ops.known_hosts(
        name="known_hosts trusts exactly the cluster's hosts (/etc/ssh/ssh_known_hosts)",
        entries=mesh.known_hosts,
        _if=whole_cluster_healthy,
    )
    for user in root_owned:
        user_trusts_exactly_the_mesh(user, whole_cluster_healthy, in_their_home=False)
    # A step in a user's home fails no node (_ignore_errors): it skips that user's later steps
    # on its node (HomeIntact), and the node fails in the mesh's last step, once its KRL is written.
    for user in in_user_homes:
        user_joins_the_mesh(
            user,
            [mesh_users_begin, HomeIntact(user.user)],
            [HomeIntact(user.user), *([no_root_step_failed] if user.moving else [])],
            in_their_home=True,
        )
    if mesh.sshd.drop_in is not None:
        # A CA move: once every node presents the new CA's host and root certificates (no node
        # failed a root-owned step of this run), the old CA joins the KRL: nothing it signed is
        # accepted anywhere again (the next run's plan, its move settled, has the same bytes).
        settled = mesh.sshd.settled_revoked_keys
        ssh_mesh_ops.revoked_keys(
            name="Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)",
            content=mesh.sshd.revoked_keys,
            _if=a_root_step_failed if settled is not None else None,
        )
        if settled is not None:
            ssh_mesh_ops.revoked_keys(
                name="Revoked mesh keys and the old CA (/etc/ssh/trainfleet_revoked_keys)",
                content=settled,
                written=mesh.sshd.revoked_keys,
                _if=no_root_step_failed,
            )
    for user in in_user_homes:
        user_trusts_exactly_the_mesh(
            user, [HomeIntact(user.user), whole_cluster_root_steps_healthy], in_their_home=True
        )
    if mesh.sshd.drop_in is None and not mesh.sshd.problems:
        ssh_mesh_ops.sshd_certificates(
            name="sshd without trainfleet's certificates",
            certificates={},
            drop_in=None,
            revoked_keys=None,
            _if=whole_cluster_root_steps_healthy,
        )
    if in_user_homes:
        ssh_mesh_ops.mesh_users_failed(
            name=f"The mesh steps in the homes of {', '.join(u.user for u in in_user_homes)} ran",
            _if=a_mesh_user_step_failed,
        )


cluster, node = this_node()

# What this node must be: from the spec, the key store and every node's facts (one remote
# command per node, read once per run); the operations below bring it there.
plan = deploy_plan(cluster).nodes[node.name]

# Names: every node knows itself and every peer by name (each a step of its own: an adopted
# cluster may keep its own hostnames and still take the block, or the reverse).
if cluster.manages("hostname"):
    hosts_ops.hostname(name="Hostname is the node's spec name", hosts=plan.hosts)
if cluster.manages("hosts"):
    hosts_ops.hosts_block(name="Cluster hosts block in /etc/hosts", hosts=plan.hosts)

# SSH mesh (ssh_mesh_steps above).
if cluster.manages("ssh_mesh"):
    ssh_mesh_steps(plan.ssh_mesh)

# pdsh: `pdsh -a` runs on every node, over ssh.
if cluster.manages("pdsh"):
    pdsh_ops.pdsh(name="pdsh over ssh to every node", pdsh=plan.pdsh)

# Software stack: CUDA, cuDNN, NCCL, OpenMPI, GCC and PyTorch exactly at the spec's pins, held.
if cluster.manages("stack"):
    stack_ops.software(
        name="Pinned software stack (CUDA, cuDNN, NCCL, OpenMPI, GCC, PyTorch)", stack=plan.stack
    )

# NCCL network environment: from each node's own network, where every rank sees it.
if cluster.manages("nccl_env"):
    nccl_env_ops.nccl_env(
        name="NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)", nccl=plan.nccl_env
    )

# OpenMPI: its TCP and wire-up layers on the same cluster network, for every mesh user.
if cluster.manages("openmpi"):
    openmpi_ops.mca_params(name="OpenMPI network (~/.openmpi/mca-params.conf)", mpi=plan.openmpi)

# Launchers: DeepSpeed, OpenMPI, Horovod, accelerate, torchrun and ColossalAI, all from the spec.
if cluster.manages("launchers"):
    launchers_ops.launcher_files(name="Launcher configs", launchers=plan.launchers)

# GPU node settings: memlock for RDMA (every node); on GPU nodes persistence mode, the NVSwitch
# fabric manager at exactly the driver's version, nvidia_peermem where InfiniBand/RoCE is active.
if cluster.manages("gpu_node"):
    gpu_node_ops.settings(
        name="GPU node settings (memlock, persistence, fabric manager, nvidia_peermem)",
        gpu=plan.gpu_node,
    )
