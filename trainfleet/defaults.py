"""Every fixed path and default that trainfleet puts on a node, in one place to scan.

Version pins are not here: they belong to the cluster spec (`stack:`), where a user
sets them; `inventories/prod.yml` shows a known-good combination.
"""

# SSH mesh
MESH_KEY_NAME = "id_trainfleet"  # each mesh user's cluster key: ~/.ssh/id_trainfleet
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
MESH_PROBE_PARALLEL = 4  # concurrent ssh probes per node (stays under sshd's MaxStartups 10)
MESH_PROBE_TIMEOUT = 10  # seconds per probe

# pdsh
PDSH_RCMD_DEFAULT = "/etc/pdsh/rcmd_default"  # read by Debian's pdsh wrapper
PDSH_GENDERS = "/etc/genders"  # `pdsh -a` on Debian/Ubuntu (genders module)
PDSH_MACHINES = "/etc/pdsh/machines"  # `pdsh -a` on RHEL-family builds (machines module)
PDSH_PROFILE = "/etc/profile.d/trainfleet-pdsh.sh"  # PDSH_RCMD_TYPE=ssh where no wrapper reads rcmd_default

# Launchers
LAUNCH_DIR = "/etc/trainfleet/launch"
VENV_DIR = "/opt/trainfleet/venv"  # the pinned PyTorch environment on every node

# NCCL network environment: written where every kind of process sees it
NCCL_PROFILE = "/etc/profile.d/trainfleet-nccl.sh"  # login shells
NCCL_ENVIRONMENT = "/etc/environment"  # non-login ssh sessions (pam_env): pdsh, mpirun, DeepSpeed
NCCL_CONF = "/etc/nccl.conf"  # every NCCL process, whatever its environment (NCCL_* only)
