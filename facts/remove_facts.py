"""What ``trainfleet remove`` reads of a node, in one remote command (``RemoveState``): every
file trainfleet writes, by capability, and which of them are trainfleet's alone.

The catalogue here is the one list of what trainfleet puts on a node; docs/remove.md must name
every path in it (a unit test holds the two together, and the catalogue to the modules'
constants). Block files are split by the deploy's own parser (trainfleet/blocks.py).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import TypedDict

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.fingerprint import FactBundle, ResolvedSections
from facts.gpu_node_facts import MEMLOCK_CONF, PEERMEM_CONF
from facts.hosts_facts import HOSTS_PURPOSE
from facts.managed_block_facts import FILE_FN, FileRead, read_file_lines
from facts.openmpi_facts import MCA_PURPOSE, OpenMpiState
from facts.pdsh_facts import PDSH_PURPOSE
from facts.shell import script, shell
from facts.ssh_mesh_facts import (
    AUTHORIZED_PURPOSE,
    CONFIG_PURPOSE,
    KNOWN_HOSTS_PURPOSE,
    SshdMesh,
    SshMeshUser,
)
from facts.stack_facts import lock_name
from trainfleet.defaults import (
    ACS_UNIT,
    ACS_UNIT_PATH,
    CUDA_KEYRING,
    GCC_PROFILE,
    HOST_CERT_SUFFIX,
    LAUNCH_DIR,
    MCA_FILE,
    MESH_KEY_NAME,
    NCCL_CONF,
    NCCL_ENVIRONMENT,
    NCCL_PROFILE,
    PDSH_GENDERS,
    PDSH_MACHINES,
    PDSH_PROFILE,
    PDSH_RCMD_DEFAULT,
    REVOKED_KEYS,
    RUN_DIR,
    SETPCI,
    SSH_MAIN_CONF,
    SSH_MESH_CONF,
    SSHD_MAIN_CONF,
    SSHD_MESH_CONF,
    SYSTEM_KNOWN_HOSTS,
    VENV_DIR,
)
from trainfleet.nccl import ENV_PURPOSE
from trainfleet.pins import PINNED_PACKAGES


@dataclass(frozen=True)
class BlockFile:
    """A file the user owns in which trainfleet keeps one managed block."""

    path: str  # absolute, or relative to a mesh user's home
    purpose: str  # the block's markers (trainfleet/blocks.py)
    capability: str
    # trainfleet made the file for its block: once the block is gone and nothing is left, the
    # empty file goes too (a file of the system's, or a link, stays even when empty)
    drop_if_empty: bool


@dataclass(frozen=True)
class OwnedFile:
    """A file trainfleet writes whole."""

    path: str
    capability: str
    # trainfleet's only if it holds exactly this (its name does not say so); None: its name does
    content: str | None = None


BLOCK_FILES = (
    BlockFile("/etc/hosts", HOSTS_PURPOSE, "hosts", False),
    BlockFile(SYSTEM_KNOWN_HOSTS, KNOWN_HOSTS_PURPOSE, "ssh_mesh", True),
    BlockFile(NCCL_ENVIRONMENT, ENV_PURPOSE, "nccl_env", False),
    BlockFile(NCCL_CONF, ENV_PURPOSE, "nccl_env", True),
    BlockFile(PDSH_GENDERS, PDSH_PURPOSE, "pdsh", True),
    BlockFile(PDSH_MACHINES, PDSH_PURPOSE, "pdsh", True),
)
HOME_BLOCK_FILES = (  # in each mesh user's home, written as that user
    BlockFile(".ssh/authorized_keys", AUTHORIZED_PURPOSE, "ssh_mesh", True),
    BlockFile(".ssh/config", CONFIG_PURPOSE, "ssh_mesh", True),
    BlockFile(MCA_FILE, MCA_PURPOSE, "openmpi", True),
)
OWNED_FILES = (
    OwnedFile(NCCL_PROFILE, "nccl_env"),
    OwnedFile(PDSH_PROFILE, "pdsh"),
    OwnedFile(PDSH_RCMD_DEFAULT, "pdsh", content="ssh\n"),  # what templates/pdsh renders
    OwnedFile(GCC_PROFILE, "stack"),
    OwnedFile(MEMLOCK_CONF, "gpu_node"),
    OwnedFile(PEERMEM_CONF, "gpu_node"),
    OwnedFile(ACS_UNIT_PATH, "remediation"),
)
# Taken out by the deploy's own step for a key mesh (ssh_mesh_ops.sshd_certificates with no
# drop-in): the drop-ins first, sshd reloaded only if its drop-in was there, then the host
# certificates trainfleet signed (their key id says so) and the KRL.
HOST_CERTIFICATES = f"/etc/ssh/ssh_host_<type>_key{HOST_CERT_SUFFIX}"
SSHD_STEP = (SSH_MESH_CONF, SSHD_MESH_CONF, REVOKED_KEYS, HOST_CERTIFICATES)
# In each mesh user's home, deleted as the user: the cluster key trainfleet made, its public
# half and its certificate.
HOME_KEY_FILES = tuple(f".ssh/{MESH_KEY_NAME}{end}" for end in ("", ".pub", HOST_CERT_SUFFIX))
# The CUDA repository's file, as trainfleet.capabilities.stack.cuda_repo_files names it.
CUDA_REPO_FILES = (
    "/etc/apt/sources.list.d/cuda-<distro>-<arch>.list",
    "/etc/yum.repos.d/cuda-<distro>.repo",
)
# What remove leaves, and why (docs/remove.md says the same): the hostname (the one before was
# not recorded), the CUDA repository and keyring the installed packages came from, the node
# lock's directory (a tmpfs, gone at the next boot), the venv without --purge-venv.
LEFT = ("/etc/hostname", *CUDA_REPO_FILES, CUDA_KEYRING, RUN_DIR, VENV_DIR)
# Paths trainfleet reads and never writes.
READ_ONLY = (SSHD_MAIN_CONF, SSH_MAIN_CONF, *SETPCI)
# Packages trainfleet installs exactly and holds: the stack's pins and the fabric manager.
# held by gpu_node (nvidia-fabricmanager-550 on Debian/Ubuntu, nvidia-fabric-manager on RHEL),
# the rest by stack
FABRIC_MANAGER = re.compile(r"^nvidia-fabric-?manager")
HELD_PACKAGES = re.compile(rf"{PINNED_PACKAGES}|{FABRIC_MANAGER.pattern}")

_SCRIPT = FILE_FN + script("remove.sh")


class RemoveFilesT(TypedDict):
    files: dict[str, FileRead]  # every root-owned block and owned file, by path
    launch: list[tuple[str, str]] | None  # (find's type letter, path below LAUNCH_DIR); None: none
    launch_link: bool  # LAUNCH_DIR is a symbolic link (nothing is removed through it)
    venv: str  # yes | missing | link
    unit: str | None  # systemctl is-enabled of the ACS unit; None: no systemd
    held: list[str]  # trainfleet's packages apt holds
    locked: list[str]  # trainfleet's packages dnf/yum version-lock


class RemoveFiles(FactBase[RemoveFilesT]):
    """
    The root-owned files trainfleet writes (bytes, framed), the launcher directory's entries,
    the venv, the ACS unit's state and trainfleet's package holds, in one command.

    .. code:: python

        {"files": {"/etc/hosts": {"state": "regular", "link": False, "data": b"..."}, ...},
         "launch": [("f", "hostfile"), ("d", "healthy")], "launch_link": False,
         "venv": "yes", "unit": "disabled", "held": ["libnccl2"], "locked": []}
    """

    def command(self) -> StringCommand:
        paths = [f.path for f in BLOCK_FILES] + [f.path for f in OWNED_FILES]
        return shell(_SCRIPT, LAUNCH_DIR, VENV_DIR, ACS_UNIT, *paths)

    def process(self, output: list[str]) -> RemoveFilesT:
        files = read_file_lines(output)
        missing = [f.path for f in (*BLOCK_FILES, *OWNED_FILES) if f.path not in files]
        if missing:
            raise FactProcessError(f"not read: {', '.join(missing)}")
        head = {
            tag: rest
            for tag, _, rest in (line.partition(" ") for line in output)
            if tag in ("launch", "venv", "unit")
        }
        if "launch" not in head or "venv" not in head:
            raise FactProcessError("the launcher directory or the venv was not read")
        held = [line[5:] for line in output if line.startswith("hold ")]
        locks = [lock_name(line[5:].strip()) for line in output if line.startswith("lock ")]
        return {
            "files": files,
            "launch": launch_entries(head["launch"]),
            "launch_link": head["launch"] == "link",
            "venv": head["venv"],
            "unit": head["unit"].strip() if "unit" in head else None,
            "held": sorted({n for n in held if HELD_PACKAGES.search(n)}),
            "locked": sorted({n for n in locks if HELD_PACKAGES.search(n)}),
        }


def launch_entries(field: str) -> list[tuple[str, str]] | None:
    """``find -printf '%y %P\\0'`` as one base64 field: [(type, path)]; None: no directory."""
    if field in ("missing", "link"):
        return None
    try:
        raw = base64.b64decode(field, validate=True).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError) as exc:
        raise FactProcessError(f"unreadable launcher directory listing ({exc})") from exc
    entries = []
    for entry in filter(None, raw.split("\0")):
        kind, _, path = entry.partition(" ")
        entries.append((kind, path))
    return entries


class RemoveState(FactBundle):
    """
    Everything ``deploy/remove.py`` reads, in one remote command: ``files`` (RemoveFiles), the
    sshd certificate mesh (``sshd_mesh``), each mesh user's SSH files (``mesh_user:<user>``,
    read as the user) and OpenMPI parameter files (``openmpi``).

    + users: the mesh users
    """

    def parts(self, users: list[str]) -> ResolvedSections:  # type: ignore[override]
        return {
            "files": (RemoveFiles, {}),
            "sshd_mesh": (SshdMesh, {}),
            **{f"mesh_user:{user}": (SshMeshUser, {"user": user}) for user in users},
            "openmpi": (OpenMpiState, {"users": list(users)}),
        }

    def command(self, users: list[str]) -> StringCommand:  # type: ignore[override]
        return super().command(users=users)
