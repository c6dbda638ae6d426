"""Every fixed path and default that trainfleet puts on a node, in one place to scan.

Version pins are not here: they belong to the cluster spec (`stack:`), where a user
sets them; `inventories/prod.yml` shows a known-good combination.
"""

# SSH mesh
MESH_KEY_NAME = "id_trainfleet"  # each mesh user's cluster key: ~/.ssh/id_trainfleet
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
MESH_PROBE_PARALLEL = 4  # concurrent ssh probes per node (stays under sshd's MaxStartups 10)
MESH_PROBE_TIMEOUT = 10  # seconds per probe
# SSH certificates (ssh.mesh: certificates): the cluster CA vouches for hosts and mesh users.
SSHD_MESH_CONF = "/etc/ssh/sshd_config.d/trainfleet-mesh.conf"  # HostCertificate, RevokedKeys
SSHD_MAIN_CONF = (
    "/etc/ssh/sshd_config"  # must Include sshd_config.d/*.conf (Debian 12, Ubuntu 22.04+, RHEL 9)
)
REVOKED_KEYS = "/etc/ssh/trainfleet_revoked_keys"  # the cluster's KRL, the same bytes on every node
# Every user's ssh refuses the host keys the KRL revokes (RevokedHostKeys), by name or address.
SSH_MESH_CONF = "/etc/ssh/ssh_config.d/trainfleet-mesh.conf"
SSH_MAIN_CONF = "/etc/ssh/ssh_config"  # must Include ssh_config.d/*.conf for every host
HOST_CERT_SUFFIX = (
    "-cert.pub"  # /etc/ssh/ssh_host_<type>_key-cert.pub, ~/.ssh/id_trainfleet-cert.pub
)
RENEW_FRACTION = 3  # the deploy signs again once less than 1/3 of the validity is left

# pdsh
PDSH_RCMD_DEFAULT = "/etc/pdsh/rcmd_default"  # read by Debian's pdsh wrapper
PDSH_GENDERS = "/etc/genders"  # `pdsh -a` on Debian/Ubuntu (genders module)
PDSH_MACHINES = "/etc/pdsh/machines"  # `pdsh -a` on RHEL-family builds (machines module)
PDSH_PROFILE = (
    "/etc/profile.d/trainfleet-pdsh.sh"  # PDSH_RCMD_TYPE=ssh where no wrapper reads rcmd_default
)

# Launchers
LAUNCH_DIR = "/etc/trainfleet/launch"
MCA_FILE = ".openmpi/mca-params.conf"  # each mesh user's OpenMPI parameters, under its home
VENV_DIR = "/opt/trainfleet/venv"  # the pinned PyTorch environment on every node

# NCCL network environment: written where every kind of process sees it
NCCL_PROFILE = "/etc/profile.d/trainfleet-nccl.sh"  # login shells
NCCL_ENVIRONMENT = "/etc/environment"  # non-login ssh sessions (pam_env): pdsh, mpirun, DeepSpeed
NCCL_CONF = "/etc/nccl.conf"  # every NCCL process, whatever its environment (NCCL_* only)

# CUDA apt repository keyring (operations/stack_repo_ops.py). Version pins of the stack live
# in the spec; this is a trust anchor, pinned here. NVIDIA's cuda-keyring .deb is checked before
# `dpkg -i`: the keyring inside it must hold exactly one key, this one: cudatools' 2022 rotation key
# 3bf863cc. Source: NVIDIA's own github.com/NVIDIA/cuda-repo-management, SIGNATURES.md (commit
# ee8303d), "Primary key fingerprint: EB69 3B30 35CD 5710 E231 E123 A4B4 6996 3BF8 63CC" for the key
# that signs the ubuntu/debian repos and the keyring .deb. No SHA-256 of the .deb is pinned: NVIDIA
# publishes none, and the file differs per <distro>/<arch> (it carries that repo's list file).
# NVIDIA lists debian13 under a newer key (8793F200): such nodes need the spec's
# stack.cuda_keyring_fingerprint until its fingerprint is confirmed from NVIDIA and added here.
CUDA_KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"  # unless stack.cuda_repo
CUDA_KEYRING_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"
CUDA_KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"  # what the cuda-keyring .deb installs

# gcc on RHEL-family: a devtoolset/gcc-toolset enabled for login shells (the stack's ``gcc``)
GCC_PROFILE = "/etc/profile.d/trainfleet-gcc.sh"

# Remediation (deploy/remediate.py; facts/remediation_facts.py reads these)
ACS_UNIT = "trainfleet-acs"  # the boot unit that turns PCIe ACS redirects off
ACS_UNIT_PATH = f"/etc/systemd/system/{ACS_UNIT}.service"
# Where pciutils installs setpci (Debian: /usr/bin; RHEL: /usr/sbin; older: /sbin, /bin): the
# unit names the one the fact found (root's, not writable by others), never a PATH lookup.
SETPCI = ("/usr/bin/setpci", "/usr/sbin/setpci", "/sbin/setpci", "/bin/setpci")
# What holds a GPU open and must let go of it for a reset, stopped in this order and started
# again in reverse: the persistence daemon, DCGM's host engine (NVIDIA's datacenter-gpu-manager
# names it nvidia-dcgm, older packages dcgm), then the fabric manager, which must come up after
# the last reset (nvidia-smi's manual: with it stopped, NVLink peers are reset together).
GPU_USERS = ("nvidia-persistenced", "nvidia-dcgm", "dcgm", "nvidia-fabricmanager")
FABRIC_MANAGER = "nvidia-fabricmanager"
UNITS = (*GPU_USERS, ACS_UNIT)  # the units the remediation fact reads

# Root's own 0700 directory on every node: the node lock and staged uploads of
# operations/remote.py, and the preflight's private working directories.
RUN_DIR = "/run/trainfleet"
