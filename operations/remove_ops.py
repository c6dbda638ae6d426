"""Taking trainfleet off a node (deploy/remove.py): its managed blocks out of the user's files
with every other byte kept, its own files, drop-ins, units and keys gone, its package holds
released. Packages stay installed; the venv stays unless asked for.

A block comes out through the deploy's own parser and writer (``block_change`` with no
lines): a file whose markers are ambiguous fails the node, untouched, naming the file. A file
trainfleet made for its block alone, left empty, is deleted the same compare-and-swap way. In a
user's home everything runs as that user. Each function returns its commands; [] is no change.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand

from facts.managed_block_facts import BlockState, FileRead, block_state
from facts.openmpi_facts import OpenMpiState
from facts.remove_facts import (
    BLOCK_FILES,
    FABRIC_MANAGER,
    HOME_BLOCK_FILES,
    OWNED_FILES,
    BlockFile,
    RemoveFiles,
)
from facts.shell import shell
from facts.ssh_mesh_facts import SshMeshUser
from operations.managed_block_ops import block_change
from operations.remote import ANY, FailCommand, as_user_command, fail_command, script
from operations.ssh_mesh_ops import home_problem, home_writer
from runtime.gather import fact
from trainfleet.blocks import split_block, with_block
from trainfleet.capabilities.launchers import KEPT_NAMES
from trainfleet.defaults import (
    ACS_UNIT,
    ACS_UNIT_PATH,
    HOST_CERT_SUFFIX,
    LAUNCH_DIR,
    MESH_KEY_NAME,
    VENV_DIR,
)
from trainfleet.pins import package_pins

# Deletes one regular file (never through a link) if it still has the bytes read; as root only
# in a directory nobody else can write.
_REMOVE_FILE = script("remote_root_safe_dir.sh") + script("remove_file.sh")
# Removes trainfleet's names from one of its root-owned directories (or the whole directory),
# then the directory and its parent where they are left empty.
_REMOVE_TREE = script("remote_root_safe_dir.sh") + script("remove_tree.sh")


_UNLOCK = (
    'if command -v dnf >/dev/null 2>&1; then dnf versionlock delete "$@"; '
    'else yum versionlock delete "$@"; fi'
)


def delete_command(path: str, expect: str = ANY, user: str | None = None) -> StringCommand:
    """Delete ``path`` if it still holds bytes of sha256 ``expect`` (ANY: whatever it holds),
    as ``user`` (None: root), holding the node's lock."""
    return as_user_command(user, _REMOVE_FILE, path, expect)


def left_empty(current: BlockState, purpose: str, drop_if_empty: bool) -> bool:
    """Whether taking the block out leaves a file trainfleet made for it alone empty (a
    regular file read whole: a link or a broken file is never deleted)."""
    if not drop_if_empty or current["broken"] or current["block"] is None:
        return False
    if current["link"] or current["sha256"] is None:
        return False
    return with_block(split_block(current["text"] or "", purpose), purpose, None) == ""


def block_out(
    path: str, purpose: str, current: BlockState, drop_if_empty: bool, user: str | None = None
) -> list[PyinfraCommand]:
    """The commands that take ``purpose``'s block out of ``path``, the user's bytes around it
    kept exactly; a file made for the block alone (``drop_if_empty``) and now empty is deleted.
    Ambiguous markers fail the node with the file untouched (``block_change``)."""
    if left_empty(current, purpose, drop_if_empty):
        return [delete_command(path, current["sha256"] or ANY, user)]
    return block_change(path, purpose, current, None, user=user)


def owned_file_out(path: str, read: FileRead, content: str | None) -> list[PyinfraCommand]:
    """Delete a file trainfleet writes whole; one it is trainfleet's only by ``content`` goes
    only if it holds exactly that (else it is the user's now: left)."""
    if read["state"] == "missing" and not read["link"]:
        return []
    if read["link"] or read["state"] != "regular" or read["data"] is None:
        return [fail_command(f"{path}: not a regular file; nothing was changed")]
    if content is not None and read["data"] != content.encode():
        return []
    return [delete_command(path, hashlib.sha256(read["data"]).hexdigest())]


def launch_dir_out(entries: list[tuple[str, str]] | None, link: bool) -> list[StringCommand]:
    """trainfleet's launcher files (``KEPT_NAMES``) and, once empty, their folders; a file of
    the user's there stays, and so does the folder that holds it."""
    if link:
        return [fail_command(f"{LAUNCH_DIR} is a symbolic link: nothing removed through it")]
    if entries is None:
        return []
    ours = sorted(path for kind, path in entries if kind == "f" and path in KEPT_NAMES)
    # what stays: anything but trainfleet's files and its healthy/ folder (a user's own folder,
    # empty or not, keeps the launcher folder; healthy/ stays while it holds a file of theirs)
    others = [
        path for kind, path in entries if path not in ours and (kind, path) != ("d", "healthy")
    ]
    if not ours and others:
        return []  # only the user's entries are left: so is the folder
    parent = LAUNCH_DIR.rsplit("/", 1)[0]
    return [as_user_command(None, _REMOVE_TREE, LAUNCH_DIR, parent, *ours)]


def acs_unit_out(delete: list[PyinfraCommand], enabled: str | None) -> list[PyinfraCommand]:
    """deploy/remediate.py's boot unit disabled, deleted (``delete``) and systemd told (ACS
    itself stays as the unit set it until the next boot)."""
    if not delete or enabled is None:  # nothing to delete, or no systemd to tell
        return delete
    disable = [StringCommand("systemctl", "disable", f"{ACS_UNIT}.service")]
    reload = [StringCommand("systemctl", "daemon-reload")]
    return [*(disable if enabled.startswith("enabled") else []), *delete, *reload]


def stack_packages(stack: Mapping[str, str | None]) -> frozenset[str]:
    """The packages the stack step pins and holds for the spec's ``stack``, under either OS
    family's names (a node holds its own family's only). A component the spec leaves out is
    pinned by nobody: a hold on it is the cluster's own."""
    names: set[str] = set()
    for family in ("debian", "rhel"):
        try:
            names |= set(package_pins(stack, family))
        except ValueError:  # refused by the spec check already; nothing of it was pinned
            continue
    return frozenset(names)


def held_by(pinned: Collection[str], fabric_manager: bool, names: list[str]) -> list[str]:
    """The held packages trainfleet holds: those the stack step pins (``pinned``, empty where
    the spec does not manage the stack: ``stack_packages``), the fabric manager where the spec
    manages the GPU node (``fabric_manager``). Any other hold is the cluster's own, and stays."""
    return [
        name for name in names if name in pinned or (fabric_manager and FABRIC_MANAGER.search(name))
    ]


def holds_out(held: list[str], locked: list[str]) -> list[StringCommand]:
    """trainfleet's holds released (apt-mark unhold; dnf/yum versionlock delete): the
    packages themselves stay installed."""
    commands = []
    if held:
        commands.append(StringCommand("apt-mark", "unhold", *(QuoteString(n) for n in held)))
    if locked:  # dnf where it is, else EL7's yum
        commands.append(shell(_UNLOCK, *locked))
    return commands


def venv_out(state: str, purge: bool) -> list[StringCommand]:
    """trainfleet's venv, only with ``purge`` (``--purge-venv``): removed with its folder."""
    if not purge or state == "missing":
        return []
    if state == "link":
        return [fail_command(f"{VENV_DIR} is a symbolic link: not removed")]
    parent = VENV_DIR.rsplit("/", 1)[0]
    return [as_user_command(None, _REMOVE_TREE, VENV_DIR, parent, "-r")]


def _read(files: dict[str, FileRead], path: str) -> FileRead:
    return files.get(path) or {"state": "missing", "link": False, "data": None}


def system_files_out(
    found: dict, purge_venv: bool, pinned: Collection[str] = (), fabric_manager: bool = False
) -> list[PyinfraCommand]:
    """Every root-owned change: blocks, whole files, the ACS unit, launcher files, trainfleet's
    holds (``held_by``), the venv (``found``: the RemoveFiles fact)."""
    files = found["files"]
    commands: list[PyinfraCommand] = []
    for block in BLOCK_FILES:
        state = block_state(_read(files, block.path), block.purpose)
        commands += block_out(block.path, block.purpose, state, block.drop_if_empty)
    for owned in OWNED_FILES:
        out = owned_file_out(owned.path, _read(files, owned.path), owned.content)
        commands += acs_unit_out(out, found["unit"]) if owned.path == ACS_UNIT_PATH else out
    commands += launch_dir_out(found["launch"], found["launch_link"])
    commands += holds_out(
        held_by(pinned, fabric_manager, found["held"]),
        held_by(pinned, fabric_manager, found["locked"]),
    )
    commands += venv_out(found["venv"], purge_venv)
    return refused_or_all(commands)


def home_files_out(user: str, mesh: dict, mpi: dict | None) -> list[PyinfraCommand]:
    """A mesh user's blocks (authorized_keys, ~/.ssh/config, mca-params.conf) out and its
    cluster key, public key and certificate deleted, all as the user (root: in root's home)."""
    if not mesh["exists"] or not mesh["home"]:
        return []  # no such user here: nothing of trainfleet's in a home
    if problem := home_problem(user, mesh):  # a ~/.ssh of another user's: the deploy's refusal
        return [fail_command(problem)]
    writer = home_writer(user, mesh)
    home = mesh["home"]
    states: dict[str, BlockState] = {
        ".ssh/authorized_keys": mesh["authorized"],
        ".ssh/config": mesh["config"],
    }
    if mpi is not None and mpi["exists"]:
        states[HOME_BLOCK_FILES[2].path] = mpi["params"]
    commands: list[PyinfraCommand] = []
    for block in HOME_BLOCK_FILES:
        if block.path in states:
            commands += _home_block_out(home, block, states[block.path], writer)
    key = f"{home}/.ssh/{MESH_KEY_NAME}"
    present = {
        key: mesh["identity"] is not None,
        f"{key}.pub": mesh["identity_pub"] is not None,
        f"{key}{HOST_CERT_SUFFIX}": mesh["certificate"] is not None,
    }
    commands += [delete_command(path, ANY, writer) for path, there in present.items() if there]
    return refused_or_all(commands)


def refused_or_all(commands: list[PyinfraCommand]) -> list[PyinfraCommand]:
    """``commands``, or where one refuses (a block with ambiguous markers, a link, a file that is
    not regular) the refusals alone: the step changes nothing until the file is fixed, so no
    half-removed node hides its leftovers behind drift's "not managed"."""
    return [c for c in commands if isinstance(c, FailCommand)] or commands


def _home_block_out(
    home: str, block: BlockFile, state: BlockState, writer: str | None
) -> list[PyinfraCommand]:
    commands = block_out(f"{home}/{block.path}", block.purpose, state, block.drop_if_empty, writer)
    folder = block.path.rsplit("/", 1)[0]
    if folder != ".ssh" and left_empty(state, block.purpose, block.drop_if_empty):
        # the folder trainfleet made for the file (~/.openmpi), if nothing else is in it
        rmdir = 'rmdir -- "$1" 2>/dev/null || true'
        commands.append(as_user_command(writer, rmdir, f"{home}/{folder}"))
    return commands


@operation()
def system_files(
    purge_venv: bool = False, pinned: Collection[str] = (), fabric_manager: bool = False
):
    """
    trainfleet's root-owned files off the node: its blocks out of /etc/hosts, /etc/environment,
    /etc/nccl.conf, the system known_hosts and pdsh's lists (the rest of each file kept byte for
    byte); its profile.d, limits.d, modules-load.d files, pdsh's rcmd_default (if still
    trainfleet's), the ACS boot unit and the launcher files deleted; its package holds released.

    + purge_venv: also delete trainfleet's venv (``/opt/trainfleet/venv``)
    + pinned: the packages the stack step pins (``stack_packages``; none: stack not managed)
    + fabric_manager: the spec manages the GPU node (its fabric manager's hold is trainfleet's)
    """
    commands = system_files_out(fact(RemoveFiles), purge_venv, pinned, fabric_manager)
    if not commands:
        host.noop("no trainfleet block, file, unit or hold in the system's files")
        return
    yield from commands


@operation()
def home_files(user: str, users: list[str]):
    """
    ``user``'s blocks and cluster key off the node, as the user (``users``: every mesh user,
    as the OpenMPI fact was read for them).
    """
    mesh = fact(SshMeshUser, user=user)
    mpi = fact(OpenMpiState, users=list(users))["users"].get(user)
    commands = home_files_out(user, mesh, mpi)
    if not commands:
        host.noop(f"no trainfleet block or key in {user}'s home")
        return
    yield from commands


@operation()
def hostname_note():
    """Nothing to change: the hostname trainfleet set stays (nothing recorded the one it
    replaced); said for each node in the run's output."""
    note = (
        "the hostname trainfleet set stays (the one before it was not recorded); "
        "`hostnamectl set-hostname NAME` sets another"
    )
    logger.warning(f"{host.print_prefix}{note}")
    host.noop(note)
    return
    yield  # an operation is a generator
