"""SSH mesh: every node reaches every node as each mesh user, with host keys verified."""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import StringCommand, operation

from facts.managed_block_facts import BlockState, ManagedBlock, block_state
from facts.shell import shell
from facts.ssh_mesh_facts import (
    AUTHORIZED_PURPOSE,
    CONFIG_PURPOSE,
    KNOWN_HOSTS_PURPOSE,
    SshdMesh,
    SshMeshUser,
)
from operations.managed_block_ops import block_change
from operations.remote import as_user_command, fail_command, script, write_command
from runtime.gather import fact, home_failures
from trainfleet.blocks import split_block, with_block
from trainfleet.defaults import (
    HOST_CERT_SUFFIX,
    MESH_KEY_NAME,
    MESH_MOVE_GRACE_SECONDS,
    REVOKED_KEYS,
    SSH_MESH_CONF,
    SSHD_MESH_CONF,
    SYSTEM_KNOWN_HOSTS,
)
from trainfleet.key_material import KeyPair

# Reload sshd only once what it will read is proven: the KRL parses (an unreadable RevokedKeys
# file makes sshd refuse EVERY key, the controller's too: then trainfleet's drop-in is moved
# aside and sshd reloaded without it) and `sshd -t` accepts the configuration (a drop-in that
# is the reason it does not is moved aside, never left for the next boot; one that is not the
# reason stays, and the node fails naming sshd's own problem).
_RELOAD_SSHD = script("ssh_mesh_reload_sshd.sh")


def reload_sshd_command() -> StringCommand:
    return shell(_RELOAD_SSHD, REVOKED_KEYS, SSHD_MESH_CONF, SSH_MESH_CONF)


def _ours(certificate_line: str) -> bool:
    """A certificate trainfleet signed (its key id, the line's comment, says so)."""
    return certificate_line.split()[-1].startswith("trainfleet:")


@operation()
def sshd_certificates(
    certificates: dict[str, str],
    drop_in: str | None,
    revoked_keys: bytes | None,
    problems: list[str] | None = None,
    client_drop_in: str | None = None,
):
    """
    sshd presents the cluster CA's certificate of its host key and refuses every revoked
    mesh key (``/etc/ssh/sshd_config.d/trainfleet-mesh.conf``), then is reloaded once, after
    ``sshd -t``; every user's ssh refuses every revoked host key
    (``/etc/ssh/ssh_config.d/trainfleet-mesh.conf``, written once the KRL it names is there:
    ssh refuses every host while its RevokedHostKeys file is missing). ``drop_in`` None takes
    all of it away again (a key mesh), the client's file first.

    + certificates: host certificate path -> its file (the plan's ``sshd.certificates``); any
      other host certificate trainfleet signed is removed
    + drop_in: the sshd_config.d file naming them and the KRL; None: no certificate mesh
    + revoked_keys: the KRL (``/etc/ssh/trainfleet_revoked_keys``), the same bytes on every node
    + problems: why this node's sshd cannot be planned (the step fails, nothing is changed)
    + client_drop_in: the ssh_config.d file naming the KRL (the plan's ``sshd.client_drop_in``)

    **Example:**

    .. code:: python

        ssh_mesh.sshd_certificates(name="sshd's host certificates", certificates={
            "/etc/ssh/ssh_host_ed25519_key-cert.pub":
                "ssh-ed25519-cert-v01@openssh.com AAAA... trainfleet:prod:host:gpu-a01\\n"},
            drop_in="HostCertificate /etc/ssh/ssh_host_ed25519_key-cert.pub\\nRevokedKeys ...\\n",
            revoked_keys=b"SSHKRL...")
    """
    if problems:
        yield fail_command("sshd: " + "; ".join(problems) + "; nothing was changed")
        return
    current = fact(SshdMesh)
    if drop_in is None:
        ours = [path for path, line in current["certificates"].items() if line and _ours(line)]
        files = (current["drop_in"], current["revoked_keys"], current["client_drop_in"])
        if all(file is None for file in files) and not ours:
            host.noop("sshd has no trainfleet certificates")
            return
        # The drop-ins first, so neither ssh nor sshd names a file that is gone; then the rest.
        if current["client_drop_in"] is not None:
            yield StringCommand("rm", "-f", "--", SSH_MESH_CONF)
        if current["drop_in"] is not None:
            yield StringCommand("rm", "-f", "--", SSHD_MESH_CONF)
            yield reload_sshd_command()
        yield StringCommand("rm", "-f", "--", *ours, REVOKED_KEYS)
        return
    changes = []
    for path, content in sorted(certificates.items()):
        if current["certificates"].get(path) != content.strip():
            changes += write_command(path, content, mode="644")
    if current["revoked_keys"] is None:  # the drop-ins name it; later changes are revoked_keys'
        changes += write_command(REVOKED_KEYS, revoked_keys or b"", mode="644")
    if current["drop_in"] != drop_in.encode():  # last: it names the files above
        changes += write_command(SSHD_MESH_CONF, drop_in, mode="644")
    client = []  # ssh reads it at each login: no reload
    if client_drop_in is not None and current["client_drop_in"] != client_drop_in.encode():
        client = write_command(SSH_MESH_CONF, client_drop_in, mode="644")
    # trainfleet's certificates of other host keys (an older deploy signed every key): gone once
    # sshd no longer names them.
    stale = sorted(
        path
        for path, line in current["certificates"].items()
        if line and _ours(line) and path not in certificates
    )
    if not changes and not client and not stale:
        host.noop(f"sshd presents {len(certificates)} host certificate; revoked keys refused")
        return
    yield from changes
    yield from client
    if changes:
        yield reload_sshd_command()
    if stale:
        yield StringCommand("rm", "-f", "--", *stale)


@operation()
def logins_under_way_finish(seconds: int = MESH_MOVE_GRACE_SECONDS):
    """
    Wait before a moving mesh drops its old trust. Every node presents the new identity by
    now, but a login that began before (its ssh read the old certificate or key, its sshd
    showed the old host certificate) may still be authenticating; dropping the old trust under
    it refuses it halfway. Declared only in a run where the mesh moves (``SshMeshPlan.moving``).

    + seconds: how long (``MESH_MOVE_GRACE_SECONDS``)
    """
    yield StringCommand("sleep", str(int(seconds)))


@operation()
def known_hosts(entries: list[str], path: str = SYSTEM_KNOWN_HOSTS, exactly: bool = True):
    """
    Keep the cluster's host trust in the system-wide known_hosts (a managed block): every
    node's host keys, or the cluster CA's ``@cert-authority`` lines.

    + entries: known_hosts lines, e.g. the plan's ``known_hosts``
    + path: the system known_hosts file
    + exactly: False ADDS ``entries`` to what the block trusts now (a mesh moving between keys
      and certificates, or to a new CA, trusts both while hosts change what they present);
      True, run after that, leaves exactly ``entries``

    **Example:**

    .. code:: python

        ssh_mesh.known_hosts(
            name="Every node's host keys",
            entries=["gpu-a01,gpu-a01.cluster.example.com,192.0.2.11 ssh-ed25519 AAAAC3Nz..."],
        )
    """
    current = fact(ManagedBlock, path=path, purpose=KNOWN_HOSTS_PURPOSE)
    if exactly:  # after the adding run of this same deploy, if there was one
        current = after_block(current, KNOWN_HOSTS_PURPOSE, trusting(current, entries), None)
    changes = block_change(
        path, KNOWN_HOSTS_PURPOSE, current, entries if exactly else trusting(current, entries)
    )
    if not changes:
        host.noop(f"{path} trusts the cluster's {len(entries)} host lines")
        return
    yield from changes


@operation()
def revoked_keys(content: bytes, written: bytes | None = None):
    """
    The cluster's key revocation list (``/etc/ssh/trainfleet_revoked_keys``), the same bytes on
    every node: sshd reads it at every login, so no reload. Run after ``mesh_user``, so a key
    rotated away is refused only once its node holds the new one.

    + content: the KRL (the plan's ``sshd.revoked_keys``, or ``sshd.settled_revoked_keys``)
    + written: what ``sshd_certificates`` wrote this run on a node that had no KRL (the plan's
      ``sshd.revoked_keys``; None: ``content``)

    **Example:**

    .. code:: python

        ssh_mesh.revoked_keys(name="Revoked mesh keys", content=plan.ssh_mesh.sshd.revoked_keys)
    """
    now = fact(SshdMesh)["revoked_keys"]
    if now is None:  # sshd_certificates wrote it this run, before its drop-in
        now = content if written is None else written
    if now == content:
        host.noop(f"{REVOKED_KEYS} is the cluster's")
        return
    yield from write_command(REVOKED_KEYS, content, mode="644")


@operation()
def mesh_users_failed():
    """
    Fails this node if a step in a mesh user's own home failed on it this run (those steps run
    with ``_ignore_errors``, so that a user who makes one fail every run cannot hold back the
    node's KRL nor the other users' steps): the run still ends failed, naming the user and step.
    Run last of the mesh's steps, with ``_if=a_mesh_user_step_failed``.

    **Example:**

    .. code:: python

        ssh_mesh.mesh_users_failed(name="Mesh users' own steps", _if=a_mesh_user_step_failed)
    """
    failed = home_failures()
    if not failed:
        host.noop("every mesh user's steps ran")
        return
    steps = [f"{user}: the step {step!r} failed in their home" for user, step in failed.items()]
    yield fail_command("; ".join(steps) + " (this node's root-owned mesh steps and its KRL ran)")


@operation()
def mesh_user(
    user: str,
    identity: KeyPair | None,
    config: list[str],
    certificate: str | None = None,
    problems: list[str] | None = None,
):
    """
    Make ``user`` a member of the SSH mesh on this node: its identity and how it reaches peers
    (what it lets in is ``mesh_trust``'s).

    + user: the mesh user (must exist)
    + identity: the node's cluster key for this user (``~/.ssh/id_trainfleet``); None removes it
    + config: ``Host`` entries for the cluster's nodes, a managed block first in ``~/.ssh/config``
    + certificate: the key's certificate (``~/.ssh/id_trainfleet-cert.pub``) in a certificate mesh
    + problems: key material the key store lacks (the step fails, nothing is changed)

    Entries the user had before are never touched. ``~/.ssh`` is kept 0700 and the private
    key 0600, owned by the user; the key is uploaded, never put on a command line.

    **Example:**

    .. code:: python

        ssh_mesh.mesh_user(name="SSH mesh for root", user="root", identity=keypair,
                           config=["Host gpu-a?? gpu-a??.cluster.example.com",
                                   "    User root", ...])
    """
    if problems:
        yield fail_command(f"{user}: " + "; ".join(problems) + "; nothing was changed")
        return
    current = fact(SshMeshUser, user=user)
    problem = home_problem(user, current)
    if problem:
        yield fail_command(problem)
        return
    commands = list(_mesh_user_changes(user, current, identity, config, certificate))
    if not commands:
        host.noop(f"{user} is in the mesh")
        return
    yield from commands


def trusting(
    current: BlockState, lines: list[str], refused: frozenset[str] = frozenset()
) -> list[str]:
    """The block while the mesh moves: what it trusts now, less any ``refused`` key (``type
    base64``: revoked ones go at once), and ``lines`` added."""
    now = [line for line in current["block"] or [] if _key_of(line) not in refused]
    return now + [line for line in lines if line not in now]


def _key_of(line: str) -> str:
    """``type base64`` of an authorized_keys or known_hosts line (options and names skipped)."""
    fields = line.split()
    for i, field in enumerate(fields[:-1]):
        if field.startswith(("ssh-", "ecdsa-", "sk-")) and fields[i + 1].startswith("AAAA"):
            return f"{field} {fields[i + 1]}"
    return line


def home_writer(user: str, current) -> str | None:
    """Who writes in the user's home: the user (root's own home: root, where root-safe rules
    apply), so a link or a race the user planted gives the user nothing new."""
    return None if current["uid"] == "0" else user


def home_problem(user: str, current) -> str | None:
    if not current["exists"]:
        return f"mesh user {user!r} does not exist on this node"
    if current["ssh_dir"] is not None and current["ssh_dir"]["owner"] != user:
        return (
            f"{current['home']}/.ssh belongs to {current['ssh_dir']['owner']}, not {user}: "
            "give it to the user by hand; nothing was changed"
        )
    return None


def _mesh_user_changes(user, current, identity, config, certificate=None):
    writer = home_writer(user, current)
    ssh_dir = f"{current['home']}/.ssh"
    if current["ssh_dir"] is not None and current["ssh_dir"]["mode"] != "700":
        yield as_user_command(writer, 'chmod 700 -- "$1"', ssh_dir)

    key_path = f"{ssh_dir}/{MESH_KEY_NAME}"
    if identity is None:
        if current["identity"] or current["identity_pub"]:
            yield as_user_command(writer, 'rm -f -- "$1" "$1.pub"', key_path)
    else:
        yield from _identity_changes(identity, current, key_path, writer)
        if certificate is not None and current["certificate"] != certificate.strip():
            # After the key it certifies; ssh reads it beside the key (IdentityFile + -cert.pub).
            yield from write_command(
                key_path + HOST_CERT_SUFFIX, certificate, mode="644", user=writer, dir_mode="700"
            )

    # First in ~/.ssh/config: ssh takes the first value it finds, so a `Host *` of the user's
    # above the block would otherwise override User/Port/IdentityFile for the cluster.
    yield from block_change(
        f"{ssh_dir}/config",
        CONFIG_PURPOSE,
        current["config"],
        config,
        mode="600",
        user=writer,
        top=True,
        dir_mode="700",
    )


def _identity_changes(identity: KeyPair, current, key_path: str, writer: str | None):
    private = current["identity"]
    owner = writer or "root"
    if (
        private is None
        or private["sha256"] != _sha256(identity.private)
        or private["owner"] != owner
    ):
        # Uploaded to a unique name in root's /run/trainfleet, written by the user from stdin;
        # the rename as the user replaces a key someone else owned with the user's own.
        yield from write_command(
            key_path, identity.private, mode="600", user=writer, secret=True, dir_mode="700"
        )
    if private is not None and private["mode"] != "600":
        yield as_user_command(writer, 'chmod 600 -- "$1"', key_path)
    public = current["identity_pub"]
    if public is None or public["sha256"] != _sha256(identity.public + "\n"):
        yield from write_command(
            key_path + ".pub", identity.public + "\n", mode="644", user=writer, dir_mode="700"
        )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@operation()
def mesh_trust(
    user: str,
    authorized: list[str],
    certificate: str | None = None,
    exactly: bool = True,
    refused: frozenset[str] = frozenset(),
):
    """
    What ``user``'s ``authorized_keys`` block lets in: every node's public key, or the cluster
    CA's ``cert-authority`` line for ``user``. Keys the user had before are never touched.

    + user: the mesh user
    + authorized: the block's lines
    + certificate: the certificate the user keeps (None: ``~/.ssh/id_trainfleet-cert.pub``
      is removed, with ``exactly``)
    + exactly: False ADDS ``authorized`` to what the block trusts now, run before any node
      changes its identity (a mesh moving between keys and certificates, or to a new CA,
      lets both in); True, run after ``mesh_user`` on every node, leaves exactly
      ``authorized``, starting from what the adding run wrote
    + refused: revoked keys (``type base64``): dropped by the adding run already

    **Example:**

    .. code:: python

        ssh_mesh.mesh_trust(
            name="root trusts the cluster CA only", user="root",
            authorized=['cert-authority,principals="root" ssh-ed25519 AAAA... trainfleet:prod:ca'])
    """
    current = fact(SshMeshUser, user=user)
    problem = home_problem(user, current)
    if problem:
        yield fail_command(problem)
        return
    writer = home_writer(user, current)
    ssh_dir = f"{current['home']}/.ssh"
    block = current["authorized"]
    lines = trusting(block, authorized, refused)
    if exactly:
        block, lines = after_block(block, AUTHORIZED_PURPOSE, lines, writer), authorized
    commands = block_change(
        f"{ssh_dir}/authorized_keys",
        AUTHORIZED_PURPOSE,
        block,
        lines,
        mode="600",
        user=writer,
        dir_mode="700",
    )
    if exactly and certificate is None and current["certificate"] is not None:
        commands.append(
            as_user_command(writer, 'rm -f -- "$1"', f"{ssh_dir}/{MESH_KEY_NAME}{HOST_CERT_SUFFIX}")
        )
    if not commands:
        host.noop(f"{user} trusts {len(lines)} authorized lines")
        return
    yield from commands


def after_block(
    current: BlockState, purpose: str, lines: list[str], writer: str | None
) -> BlockState:
    """The file an earlier operation of this run left behind by giving its block ``lines``:
    ``current`` with that block (unchanged where that is what it holds, or where it cannot be
    written: broken; a link is written through, or the node fails on it)."""
    if current["broken"] or current["block"] == lines:
        return current
    text = with_block(split_block(current["text"] or "", purpose), purpose, lines)
    return block_state(
        {"state": "regular", "link": False, "data": text.encode("utf-8", "surrogateescape")},
        purpose,
    )
