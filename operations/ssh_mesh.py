"""SSH mesh: every node reaches every node as each mesh user, with host keys verified."""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import operation

from facts.managed_block import ManagedBlock
from facts.gather import fact
from facts.ssh_mesh import AUTHORIZED_PURPOSE, CONFIG_PURPOSE, KNOWN_HOSTS_PURPOSE, SshMeshUser
from operations.managed_block import block_change
from operations.remote import as_user_command, fail_command, write_command
from trainfleet.defaults import MESH_KEY_NAME, SYSTEM_KNOWN_HOSTS
from trainfleet.keystore import KeyPair


@operation()
def known_hosts(entries: list[str], path: str = SYSTEM_KNOWN_HOSTS):
    """
    Keep every cluster node's host keys in the system-wide known_hosts (a managed block).

    + entries: known_hosts lines, e.g. the plan's ``known_hosts``
    + path: the system known_hosts file

    **Example:**

    .. code:: python

        ssh_mesh.known_hosts(
            name="Every node's host keys",
            entries=["gpu-a01,gpu-a01.cluster.example.com,192.0.2.11 ssh-ed25519 AAAAC3Nz..."],
        )
    """
    current = fact(ManagedBlock, path=path, purpose=KNOWN_HOSTS_PURPOSE)
    changes = block_change(path, KNOWN_HOSTS_PURPOSE, current, entries)
    if not changes:
        host.noop(f"{path} holds {len(entries)} cluster host keys")
        return
    yield from changes


@operation()
def mesh_user(user: str, identity: KeyPair | None, authorized: list[str], config: list[str]):
    """
    Make ``user`` a member of the SSH mesh on this node.

    + user: the mesh user (must exist)
    + identity: the node's cluster key for this user (``~/.ssh/id_trainfleet``); None removes it
    + authorized: public keys of every node, kept in a managed block of ``authorized_keys``
    + config: ``Host`` entries for the cluster's nodes, a managed block first in ``~/.ssh/config``

    Keys and entries the user had before are never touched. ``~/.ssh`` is kept 0700 and the
    private key 0600, owned by the user; the key is uploaded, never put on a command line.

    **Example:**

    .. code:: python

        ssh_mesh.mesh_user(name="SSH mesh for root", user="root", identity=keypair,
                           authorized=[...], config=["Host gpu-a01 gpu-a02", "    User root", ...])
    """
    current = fact(SshMeshUser, user=user)
    if not current["exists"]:
        yield fail_command(f"mesh user {user!r} does not exist on this node")
        return
    commands = list(_mesh_user_changes(user, current, identity, authorized, config))
    if not commands:
        host.noop(f"{user} is in the mesh with {len(authorized)} keys")
        return
    yield from commands


def _mesh_user_changes(user, current, identity, authorized, config):
    # Everything in the home is done AS the user (root's own home: as root, where root-safe
    # rules apply), so a link or a race the user planted gives the user nothing new.
    # ``writer`` None is root.
    writer = None if current["uid"] == "0" else user
    ssh_dir = f"{current['home']}/.ssh"
    if current["ssh_dir"] is not None:
        if current["ssh_dir"]["owner"] != user:
            yield fail_command(f"{ssh_dir} belongs to {current['ssh_dir']['owner']}, not {user}: "
                               "give it to the user by hand; nothing was changed")
            return
        if current["ssh_dir"]["mode"] != "700":
            yield as_user_command(writer, 'chmod 700 -- "$1"', ssh_dir)

    key_path = f"{ssh_dir}/{MESH_KEY_NAME}"
    if identity is None:
        if current["identity"] or current["identity_pub"]:
            yield as_user_command(writer, 'rm -f -- "$1" "$1.pub"', key_path)
    else:
        yield from _identity_changes(identity, current, key_path, writer)

    yield from block_change(f"{ssh_dir}/authorized_keys", AUTHORIZED_PURPOSE, current["authorized"], authorized,
                            mode="600", user=writer, dir_mode="700")
    # First in ~/.ssh/config: ssh takes the first value it finds, so a `Host *` of the user's
    # above the block would otherwise override User/Port/IdentityFile for the cluster.
    yield from block_change(f"{ssh_dir}/config", CONFIG_PURPOSE, current["config"], config,
                            mode="600", user=writer, top=True, dir_mode="700")


def _identity_changes(identity: KeyPair, current, key_path: str, writer: str | None):
    private = current["identity"]
    owner = writer or "root"
    if private is None or private["sha256"] != _sha256(identity.private) or private["owner"] != owner:
        # Uploaded to a unique name in root's /run/trainfleet, written by the user from stdin;
        # the rename as the user replaces a key someone else owned with the user's own.
        yield from write_command(key_path, identity.private, mode="600", user=writer, secret=True, dir_mode="700")
    if private is not None and private["mode"] != "600":
        yield as_user_command(writer, 'chmod 600 -- "$1"', key_path)
    public = current["identity_pub"]
    if public is None or public["sha256"] != _sha256(identity.public + "\n"):
        yield from write_command(key_path + ".pub", identity.public + "\n", mode="644", user=writer, dir_mode="700")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
