"""The cluster, capability by capability: ``pyinfra inventories/prod.py deploy/cluster.py``.

Each line is one capability; its operation lives in operations/<capability>.py,
its facts in facts/<capability>.py, its templates in templates/<capability>/.
"""

from facts.fingerprint import DeployState
from operations import gather, hosts, launchers, nccl_env, openmpi, pdsh, ssh_mesh, stack
from trainfleet import mesh
from trainfleet.inventory import this_node
from trainfleet.keystore import KeyStore
from trainfleet.launchers import render_launchers
from trainfleet.nccl import Derived, uniform_variables

cluster, node = this_node()
keys = KeyStore(cluster.name, nodes=[n.name for n in cluster.nodes])  # retires removed nodes' keys

# What every node is now: all the facts the steps below read, one remote command per node.
gather.read_once(DeployState, users=cluster.mesh_users)

# Names: every node knows itself and every peer by name.
hosts.hostname(name="Hostname is the node's spec name", hostname=node.name)
hosts.hosts_block(name="Cluster hosts block in /etc/hosts", entries=cluster.hosts_entries())

# SSH mesh: every node reaches every node as each mesh user, host keys verified.
ssh_mesh.known_hosts(name="Every node's host keys in /etc/ssh/ssh_known_hosts",
                     entries=mesh.known_hosts_lines(cluster, ssh_mesh.cluster_host_keys(cluster)))
for user in cluster.mesh_users:
    ssh_mesh.mesh_user(name=f"SSH mesh for {user}", user=user, identity=mesh.identity(user, node, keys),
                       authorized=mesh.authorized_lines(cluster, user, keys), peers=cluster.nodes)

# pdsh: `pdsh -a` runs on every node, over ssh.
pdsh.pdsh(name="pdsh over ssh to every node", nodes=[n.name for n in cluster.nodes])

# Software stack: CUDA, cuDNN, NCCL, GCC and PyTorch exactly at the spec's pins, held.
stack.software(name="Pinned software stack (CUDA, cuDNN, NCCL, GCC, PyTorch)", pins=cluster.stack)

# NCCL network environment: from each node's own network, where every rank sees it.
derived = nccl_env.cluster_nccl_env(cluster)
mine = derived.get(node.name) or Derived(problems=["the node's network could not be read"])
nccl_env.nccl_env(name="NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)",
                  env=mine.env, problems=mine.problems)

# OpenMPI: its TCP and wire-up layers on the same cluster network, for every mesh user.
mca, mca_problems = openmpi.cluster_mca_params(cluster)
openmpi.mca_params(name="OpenMPI network (~/.openmpi/mca-params.conf)", users=cluster.mesh_users,
                   params=mca, problems=mca_problems)

# Launchers: DeepSpeed, OpenMPI, Horovod, accelerate, torchrun and ColossalAI, all from the spec.
uniform = uniform_variables({name: d.env for name, d in derived.items() if not d.problems})
launchers.launcher_files(name="Launcher configs", files=render_launchers(
    cluster, node, forward={k: v for k, v in mine.env.items() if k in uniform}, mca=mca))
