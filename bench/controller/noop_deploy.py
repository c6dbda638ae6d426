"""pyinfra's own cost of deploy/cluster.py's operations: as many operations, with the same
names, each reading no fact and changing nothing (one mesh user: 10 operations)."""

from pyinfra import host
from pyinfra.api import operation

OPERATIONS = [
    "Hostname is the node's spec name",
    "Cluster hosts block in /etc/hosts",
    "Every node's host keys in /etc/ssh/ssh_known_hosts",
    "SSH mesh for root",
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
