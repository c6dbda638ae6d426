"""Take trainfleet off the cluster: ``trainfleet remove SPEC`` (``pyinfra INVENTORY
deploy/remove.py``).

On every node, from one remote read (``RemoveState``): trainfleet's managed blocks come out of
the user's files with every other byte kept, its own files, drop-ins, units and mesh keys are
deleted, sshd is reloaded only where its drop-in went, and its package holds are released.
Packages stay installed; trainfleet's venv stays unless ``--data trainfleet_purge_venv=1``
(``trainfleet remove SPEC --purge-venv``). The hostname trainfleet set stays: nothing recorded
the one before it. A second run changes nothing. docs/remove.md lists every path.
"""

from pyinfra import host

from facts.remove_facts import RemoveState
from operations import remove_ops, ssh_mesh_ops
from runtime.gather import read_once, this_node

cluster, node = this_node()
purge_venv = str(host.data.get("trainfleet_purge_venv", "")) in ("1", "true", "True", "yes")

# Everything below reads this node's state from here: one remote command per node, once per run.
read_once(RemoveState, users=cluster.mesh_users)

# Mesh users' homes first (as each user), then the system's files: the known_hosts block and
# sshd's drop-in go last among the mesh's, so no login in between meets half a mesh.
for user in cluster.mesh_users:
    remove_ops.home_files(
        name=f"trainfleet's blocks and cluster key out of {user}'s home",
        user=user,
        users=cluster.mesh_users,
    )
remove_ops.system_files(
    name="trainfleet's blocks, files, units and holds out of the system",
    purge_venv=purge_venv,
    pinned=sorted(remove_ops.stack_packages(cluster.stack)) if cluster.manages("stack") else [],
    fabric_manager=cluster.manages("gpu_node"),
)
# The certificate mesh's drop-ins first, sshd reloaded (only if its drop-in was there), then
# the host certificates trainfleet signed and the KRL: the deploy's own step for a key mesh.
ssh_mesh_ops.sshd_certificates(
    name="sshd without trainfleet's certificates",
    certificates={},
    drop_in=None,
    revoked_keys=None,
)
if cluster.manages("hostname"):
    remove_ops.hostname_note(name="Hostname left as it is")
