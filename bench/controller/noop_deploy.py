"""pyinfra's own cost of deploy/cluster.py's operations: as many operations, with the same names,
each reading no fact and changing nothing (one mesh user: 15 operations, in either mesh: sshd's
certificates come before the mesh users in a certificate mesh, their removal after the trust in a
key mesh)."""

from pyinfra import host
from pyinfra.api import operation

OPERATIONS = [
    "Hostname is the node's spec name",
    "Cluster hosts block in /etc/hosts",
    "known_hosts also trusts the cluster's new host lines",
    "sshd presents its host certificates, refuses revoked keys",
    "root also trusts the mesh's new lines",
    "SSH mesh for root",
    "known_hosts trusts exactly the cluster's hosts (/etc/ssh/ssh_known_hosts)",
    "root trusts exactly the mesh",
    "Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)",
    "pdsh over ssh to every node",
    "Pinned software stack (CUDA, cuDNN, NCCL, OpenMPI, GCC, PyTorch)",
    "NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)",
    "OpenMPI network (~/.openmpi/mca-params.conf)",
    "Launcher configs",
    "GPU node settings (memlock, persistence, fabric manager, nvidia_peermem)",
]


@operation()
def nothing(what: str):
    host.noop(f"{what}: nothing to do")
    return
    yield  # an operation is a generator


for _name in OPERATIONS:
    nothing(name=_name, what=_name)
