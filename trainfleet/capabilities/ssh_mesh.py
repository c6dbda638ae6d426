"""The SSH mesh: each mesh user's key, authorized_keys, ssh config and certificate, sshd's
host certificates, drop-in and KRL, the system known_hosts; a live login probe of every peer.

The cluster-wide part (certificates, authorized keys, config, who is moving) is built once per
run (``shared``); each node's part from it (``plan_part``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from trainfleet import certificates, mesh
from trainfleet.capabilities import pdsh
from trainfleet.compare import ABSENT, Content, content, digest
from trainfleet.defaults import (
    MESH_KEY_NAME,
    REVOKED_KEYS,
    SSH_MAIN_CONF,
    SSHD_MESH_CONF,
    SYSTEM_KNOWN_HOSTS,
)
from trainfleet.grammar import (
    NULL,
    Key,
    Section,
    controller_path_problem,
    port_problem,
    user_problem,
)
from trainfleet.key_material import NO_CA, KeyMaterial, KeyPair
from trainfleet.mesh import (
    certificate_summary,
    file_digest,
    host_certificates_summary,
    sshd_files_digest,
)
from trainfleet.model import Cluster, Node
from trainfleet.plan_types import Gathered, NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render, render_lines

# every property it expects is its step's (manage.ssh_mesh)
MANAGED = MappingProxyType({"ssh_mesh": ("",)})

MAJORITY = ("known_hosts block", "authorized_keys")


@dataclass(frozen=True)
class MeshUserPlan:
    user: str
    identity: KeyPair | None  # ~/.ssh/id_trainfleet; None once revoked
    authorized: list[str]  # the authorized_keys block
    config: list[str]  # the ~/.ssh/config block
    certificate: str | None = (
        None  # ~/.ssh/id_trainfleet-cert.pub (ssh.mesh: certificates); None: no file
    )
    refused: frozenset[str] = (
        frozenset()
    )  # ``type base64`` of every revoked mesh key: never kept, even while moving
    moving: bool = (
        False  # some node trusts another way now: identities change only in a run without failures
    )
    problems: list[str] = field(default_factory=list)  # key material the store lacks


@dataclass(frozen=True)
class SshdPlan:
    """sshd's part of the mesh: in a certificate mesh, the host certificates, the drop-in that
    names them and the KRL; in a key mesh, none of them (``drop_in`` None removes them)."""

    certificates: dict[str, str]  # host certificate path -> file content
    drop_in: str | None  # /etc/ssh/sshd_config.d/trainfleet-mesh.conf
    revoked_keys: bytes | None  # /etc/ssh/trainfleet_revoked_keys
    problems: list[str] = field(default_factory=list)
    client_drop_in: str | None = None  # /etc/ssh/ssh_config.d/trainfleet-mesh.conf (ssh's KRL)
    # some node's known_hosts trusts another way now: certificates change only without failures
    moving: bool = False
    # a CA move: the KRL once every node presents the new CA's (the old CA refused too)
    settled_revoked_keys: bytes | None = None


def mesh_user_part(
    cluster: Cluster,
    node: Node,
    user: str,
    keys: KeyMaterial,
    authorized: list[str],
    config: list[str],
    certs: mesh.Certificates | None,
    current: str | None,
    refused: frozenset[str] = frozenset(),
    user_moving: bool = False,
) -> MeshUserPlan:
    """A mesh user on a node: its key, and in a certificate mesh the key's certificate for
    the principal ``user`` (kept while valid, signed anew when due). Key material the store
    lacks (its own key; in a key mesh any node's; the CA) is the part's problem."""
    identity = mesh.identity(user, node, keys)
    problems = keys.missing_problems(user, [node.name] if cluster.mesh == "certificates" else None)
    if cluster.mesh == "certificates" and certs is None:
        problems.append(NO_CA)
    certificate = None
    if certs and identity:
        certificate = (
            certs.certificate(
                current,
                identity.public,
                "user",
                [user],
                f"trainfleet:{cluster.name}:{user}@{node.name}",
            )
            + "\n"
        )
    return MeshUserPlan(
        user=user,
        identity=identity,
        authorized=authorized,
        config=config,
        certificate=certificate,
        refused=refused,
        moving=user_moving,
        problems=problems,
    )


def sshd_part(
    cluster: Cluster,
    node: Node,
    gathered: Gathered,
    certs: mesh.Certificates | None,
    partial: bool = False,
) -> SshdPlan:
    """sshd's certificates, drop-in and KRL on a node (none of them in a key mesh); a node
    whose sshd would not read them, or whose host keys were not read, carries the problem."""
    if certs is None:  # a key mesh, or a certificate mesh whose store has no CA yet
        problems = [NO_CA] if cluster.mesh == "certificates" else []
        return SshdPlan(certificates={}, drop_in=None, revoked_keys=None, problems=problems)
    found = gathered.sshd.get(node.name)
    host_keys = (gathered.host_keys or {}).get(node.name)
    problems = []
    if found is None or not host_keys:
        problems.append("the node's sshd files or host keys could not be read")
    else:
        if not found["includes_drop_ins"]:
            problems.append(
                "/etc/ssh/sshd_config does not read /etc/ssh/sshd_config.d/*.conf: add "
                "`Include /etc/ssh/sshd_config.d/*.conf` at its top, or set ssh.mesh: keys"
            )
        for path, line in found["certificates"].items():
            if line and not line.split()[-1].startswith("trainfleet:"):
                problems.append(
                    f"{path} holds a host certificate trainfleet did not sign "
                    f"({line.split()[-1]}): move it aside (and its HostCertificate line), "
                    "or set ssh.mesh: keys"
                )
        for path in found["other_revoked_keys"]:
            problems.append(
                f"{path} sets RevokedKeys, which trainfleet's mesh would override: "
                "merge it into the cluster's (or set ssh.mesh: keys)"
            )
        problems += revoked_host_key_problems(node, host_keys, certs.revoked)
        problems += client_problems(found)
        if not mesh.certified_host_key(host_keys):
            problems.append(
                "the node has no ed25519 (or RSA) host key for the CA to certify: "
                "`ssh-keygen -A` makes one, or set ssh.mesh: keys"
            )
    if certs.moving and partial:
        problems.append(
            "the cluster CA is being replaced (keys rotate-ca) and this run does not reach "
            "every node: deploy the whole cluster at once (a node moved alone would be cut off "
            "from the others); a node that is down: take it out of the spec for now, "
            "put it back once it is up (docs/ssh_mesh.md)"
        )
    if problems:
        return SshdPlan(certificates={}, drop_in=None, revoked_keys=None, problems=problems)
    assert found is not None and host_keys  # else a problem above
    wanted = mesh.host_certificates(cluster, node, host_keys, found["certificates"], certs)
    drop_in = render(
        "ssh_mesh/sshd_mesh.conf.j2",
        cluster=cluster.name,
        certificates=sorted(wanted),
        revoked_keys=REVOKED_KEYS,
    )
    client = render("ssh_mesh/ssh_mesh.conf.j2", cluster=cluster.name, revoked_keys=REVOKED_KEYS)
    return SshdPlan(
        certificates=wanted,
        drop_in=drop_in,
        revoked_keys=certs.revoked_keys,
        client_drop_in=client,
        settled_revoked_keys=certs.settled_revoked_keys,
    )


def client_problems(found: Mapping[str, Any]) -> list[str]:
    """Why every user's ssh would not read the cluster's KRL from trainfleet's ssh_config.d file."""
    problems = []
    if not found["client_includes_drop_ins"]:
        problems.append(
            f"{SSH_MAIN_CONF} does not read /etc/ssh/ssh_config.d/*.conf for every "
            "host: add `Include /etc/ssh/ssh_config.d/*.conf` at its top (before any "
            "Host or Match), or set ssh.mesh: keys"
        )
    for path in found["other_revoked_host_keys"]:
        problems.append(
            f"{path} sets RevokedHostKeys: ssh reads one such file, so it or the "
            "cluster's would be ignored: merge it into the cluster's "
            "(or set ssh.mesh: keys)"
        )
    return problems


def revoked_host_key_problems(
    node: Node, host_keys: list[str], revoked: frozenset[str]
) -> list[str]:
    """A node presenting a host key the cluster revoked is not vouched for again (revocation
    is monotone): it is named, with the two ways out."""
    return [
        f"it presents the host key {certificates.fingerprint(key)} ({key.split()[0]}), "
        "which the cluster revoked: give the node new host keys (reimage it, or move "
        "/etc/ssh/ssh_host_*_key* aside, run `ssh-keygen -A` and update the controller's "
        "known_hosts), or, only if that key is known safe, take it back with "
        f"`python -m trainfleet keys readmit SPEC {node.name} --fingerprint "
        f"{certificates.fingerprint(key)}`"
        for key in host_keys
        if " ".join(key.split()[:2]) in revoked
    ]


def moving(cluster: Cluster, gathered: Gathered, part: str, lines: list[str]) -> bool:
    """Some node read this run trusts another way than ``lines`` in ``part`` (a user's
    authorized_keys block, or SYSTEM_KNOWN_HOSTS) and not yet these: changing what nodes present now
    would cut it off unless its own trust step held. A node with no block yet (a new node) is
    not moving: nothing of it works yet to be cut."""
    for node in cluster.nodes:
        block = gathered.trust.get(node.name, {}).get(part)
        if block and not set(lines) <= set(block):
            return True
    return False


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {
        "host_keys": ("SshHostKeys", {}),
        "sshd_mesh": ("SshdMesh", {}),
        "known_hosts": ("KnownHostsBlock", {}),
        **{f"mesh_user:{user}": ("SshMeshUser", {"user": user}) for user in users},
    }


def check_sections(users: list[str], peers: list[str]) -> Sections:
    """A live probe of every peer as each mesh user (drift's and the preflight's)."""
    return {
        f"mesh_proof:{user}": ("SshMeshProof", {"user": user, "peers": list(peers)})
        for user in users
    }


@dataclass(frozen=True)
class MeshShared:
    """The mesh's cross-node part, built once per run: the lines every node trusts, each user's
    authorized_keys and ssh config, the certificates' CA, who is moving."""

    keys: KeyMaterial | None  # as the next deploy's prepare_keys leaves it (None: no mesh)
    known_hosts: list[str]
    certs: mesh.Certificates | None
    refused: frozenset[str]  # ``type base64`` of every revoked mesh key
    partial: bool  # some node was not read this run
    authorized: dict[str, list[str]]  # user -> authorized_keys block
    config: dict[str, list[str]]  # user -> ~/.ssh/config block
    users_moving: dict[str, bool]
    hosts_moving: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SshMeshPlan:
    known_hosts: list[str]  # the system known_hosts block
    users: list[MeshUserPlan]  # empty in a plan made without the key store
    sshd: SshdPlan | None  # None in a plan made without the key store

    @property
    def moving(self) -> bool:
        """Some node trusts another way now (a host or a user): this run drops the old trust."""
        return bool(self.sshd and self.sshd.moving) or any(user.moving for user in self.users)


def _known_hosts(
    ctx: PlanContext, keys: KeyMaterial | None, certs: mesh.Certificates | None
) -> tuple[list[str], list[str]]:
    """The system known_hosts block, and the notes on nodes whose keys came from the
    controller's known_hosts."""
    cluster, gathered = ctx.cluster, ctx.gathered
    if certs:
        return mesh.ca_known_hosts_lines(cluster, certs.ca_public), []
    if gathered.host_keys is None or (keys and cluster.mesh == "certificates"):
        return [], []
    host_keys, fallback = mesh.cluster_host_keys(cluster, dict(gathered.host_keys))
    notes = [
        f"[{name}] not reachable: its host keys come from the controller's known_hosts "
        f"({len(host_keys[name])} found)"
        for name in fallback
    ]
    return mesh.known_hosts_lines(cluster, host_keys), notes


def _settled_keys(ctx: PlanContext) -> KeyMaterial | None:
    """The key material as the deploy's prepare_keys will leave it. A host key the CA vouched
    for that its node no longer presents (reimaged, removed from the spec) keeps a valid
    certificate: the KRL must refuse it (the deploy's prepare_keys recorded that already; drift
    expects it of the next deploy); a CA move that every node has made is settled."""
    cluster, gathered = ctx.cluster, ctx.gathered
    keys: KeyMaterial | None = ctx.keys
    if not (keys and cluster.mesh == "certificates" and gathered.host_keys is not None):
        return keys
    seen = {name: found for name, found in gathered.host_keys.items() if found}
    keys = keys.presenting(
        seen, [n.name for n in cluster.nodes], mesh.unread_host_keys(cluster, seen)
    )
    if keys.ca_moving and keys.ca and mesh.settles(cluster, gathered, keys.ca.public, keys):
        keys = keys.settled()
    return keys


def _user_files(
    ctx: PlanContext, keys: KeyMaterial | None, certs: mesh.Certificates | None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each mesh user's authorized_keys and ssh config blocks (none without the key store)."""
    cluster, users = ctx.cluster, ctx.cluster.mesh_users
    if keys and cluster.mesh == "certificates":  # no CA yet: no line (the parts name it)
        authorized = {
            user: [mesh.ca_authorized_line(cluster, user, certs.ca_public)] if certs else []
            for user in users
        }
        groups = mesh.cluster_patterns(cluster, addresses=False)
        template = "ssh_mesh/ssh_config_patterns.j2"
        context: dict[str, Any] = {"groups": groups, "revoked_keys": REVOKED_KEYS}
    else:
        authorized = (
            {user: mesh.authorized_lines(cluster, user, keys) for user in users} if keys else {}
        )
        template, context = "ssh_mesh/ssh_config.j2", {"nodes": cluster.nodes}
    config = {
        user: render_lines(template, user=user, key_name=MESH_KEY_NAME, **context) for user in users
    }
    return authorized, config


def shared(ctx: PlanContext) -> MeshShared:
    cluster, gathered = ctx.cluster, ctx.gathered
    keys = _settled_keys(ctx)
    certs = (
        mesh.plan_certificates(cluster, keys) if keys and cluster.mesh == "certificates" else None
    )
    known_hosts, notes = _known_hosts(ctx, keys, certs)
    authorized, config = _user_files(ctx, keys, certs)
    users = cluster.mesh_users
    return MeshShared(
        keys=keys,
        known_hosts=known_hosts,
        certs=certs,
        refused=frozenset(" ".join(line.split()[:2]) for line in keys.revoked_keys())
        if keys
        else frozenset(),
        partial=not {n.name for n in cluster.nodes} <= set(gathered.sshd),
        authorized=authorized,
        config=config,
        users_moving={user: moving(cluster, gathered, user, authorized[user]) for user in users}
        if keys
        else {},
        hosts_moving=moving(cluster, gathered, SYSTEM_KNOWN_HOSTS, known_hosts),
        notes=tuple(notes),
    )


def shared_part(ctx: PlanContext) -> MeshShared:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("ssh_mesh", MeshShared)


def part(plan: NodePlan) -> SshMeshPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("ssh_mesh", SshMeshPlan)


def plan_part(ctx: PlanContext, node: Node) -> SshMeshPlan:
    """The node's mesh users and sshd part, from the cluster-wide parts built once."""
    cluster, gathered = ctx.cluster, ctx.gathered
    mine = shared_part(ctx)
    keys, certs = mine.keys, mine.certs
    users = (
        []
        if keys is None
        else [
            mesh_user_part(
                cluster,
                node,
                user,
                keys,
                mine.authorized[user],
                mine.config[user],
                certs,
                gathered.user_certificates.get(node.name, {}).get(user),
                mine.refused,
                mine.users_moving[user],
            )
            for user in cluster.mesh_users
        ]
    )
    sshd = sshd_part(cluster, node, gathered, certs, mine.partial) if keys else None
    if sshd is not None and mine.hosts_moving:
        sshd = replace(sshd, moving=True)
    return SshMeshPlan(known_hosts=mine.known_hosts, users=users, sshd=sshd)


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    sshd = fp["sshd_mesh"]
    props = {
        "known_hosts block": digest(fp["known_hosts"]["block"]),
        "host certificates": host_certificates_summary(sshd["certificates"]),
        "sshd mesh files": sshd_files_digest(sshd["drop_in"], sshd["revoked_keys"]),
        "ssh client drop-in": file_digest(sshd["client_drop_in"]),
    }
    mine = part(plan)
    if mine.sshd is not None:  # a node whose sshd part cannot be planned is a finding, not a gap
        props["sshd mesh plan"] = "; ".join(mine.sshd.problems) or "ok"
    for user_part in mine.users:  # key material the store lacks is a finding
        props[f"ssh mesh plan ({user_part.user})"] = "; ".join(user_part.problems) or "ok"
    for user in cluster.mesh_users:
        state = fp[f"mesh_user:{user}"]
        props[f"user certificate ({user})"] = certificate_summary(state["certificate"])
        props[f"authorized_keys ({user})"] = digest(state["authorized"]["block"])
        props[f"ssh config ({user})"] = digest(state["config"]["block"])
        key = state["identity"]
        props[f"cluster key ({user})"] = f"{key['sha256'][:12]} {key['mode']}" if key else ABSENT
        proof = fp[f"mesh_proof:{user}"]
        failures = {peer: why for peer, why in proof.items() if why != "ok"}
        if not proof:  # the probe printed nothing: a check that saw nothing is no pass
            props[f"ssh mesh ({user})"] = "not probed"
        else:
            props[f"ssh mesh ({user})"] = (
                "ok"
                if not failures
                else "fails: "
                + "; ".join(f"{peer} ({why})" for peer, why in sorted(failures.items()))
            )
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    props = {}
    mine = part(plan)
    sshd = mine.sshd
    if not (sshd and NO_CA in sshd.problems):  # no CA: nothing to trust by yet
        props["known_hosts block"] = digest(mine.known_hosts)
    if sshd is not None:
        props["sshd mesh plan"] = "ok"
    if sshd and not sshd.problems:
        props["host certificates"] = host_certificates_summary(sshd.certificates)
        props["sshd mesh files"] = sshd_files_digest(sshd.drop_in, sshd.revoked_keys)
        props["ssh client drop-in"] = file_digest(sshd.client_drop_in)
    for user in mine.users:
        props[f"ssh config ({user.user})"] = digest(user.config)
        props[f"ssh mesh ({user.user})"] = "ok"
        props[f"ssh mesh plan ({user.user})"] = "ok"  # its problems show as this property's value
        if user.problems:  # key material the store lacks: nothing of it is expected
            continue
        props[f"user certificate ({user.user})"] = certificate_summary(user.certificate)
        props[f"authorized_keys ({user.user})"] = digest(user.authorized)
        props[f"cluster key ({user.user})"] = (
            f"{_sha256(user.identity.private)[:12]} 600" if user.identity else ABSENT
        )
    return props


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _user_contents(
    user: str, authorized: list[str] | None, config: list[str] | None
) -> dict[str, dict[str, Content]]:
    return {
        f"authorized_keys ({user})": {
            f"~{user}/.ssh/authorized_keys": content(authorized, shown=False)
        },
        f"ssh config ({user})": {f"~{user}/.ssh/config": content(config)},
    }


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    """Key material by digest only."""
    sshd = fp["sshd_mesh"]
    # the file's bytes as text; bytes that are not UTF-8 survive unchanged (as facts' decode)
    drop_in = (
        None if sshd["drop_in"] is None else sshd["drop_in"].decode("utf-8", "surrogateescape")
    )
    found = {
        "known_hosts block": {SYSTEM_KNOWN_HOSTS: content(fp["known_hosts"]["block"], shown=False)},
        "sshd mesh files": {
            SSHD_MESH_CONF: content(drop_in),
            REVOKED_KEYS: content(sshd["revoked_keys"], shown=False),
        },
    }
    for user in users:
        state = fp[f"mesh_user:{user}"]
        found |= _user_contents(user, state["authorized"]["block"], state["config"]["block"])
    return found


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    mine = part(plan)
    wanted = {"known_hosts block": {SYSTEM_KNOWN_HOSTS: content(mine.known_hosts, shown=False)}}
    if mine.sshd is not None:
        wanted["sshd mesh files"] = {
            SSHD_MESH_CONF: content(mine.sshd.drop_in),
            REVOKED_KEYS: content(mine.sshd.revoked_keys, shown=False),
        }
    for user in mine.users:
        wanted |= _user_contents(user.user, user.authorized, user.config)
    return wanted


def _encoded(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def converged(plan: NodePlan) -> dict[str, Any]:
    """The node's host keys are its own (not the plan's to say); every node lets its mesh
    users in, itself included (drift's full probe and a one-node cluster's ask it)."""
    sshd = part(plan).sshd
    out: dict[str, Any] = {
        "known_hosts": {"block": list(part(plan).known_hosts), "outside": []},
        "sshd_mesh": {
            "includes_drop_ins": True,
            "other_revoked_keys": [],
            "certificates": dict(sshd.certificates) if sshd else {},
            "drop_in": _encoded(sshd.drop_in) if sshd else None,
            "revoked_keys": sshd.revoked_keys if sshd else None,
            "client_includes_drop_ins": True,
            "other_revoked_host_keys": [],
            "client_drop_in": _encoded(sshd.client_drop_in) if sshd else None,
        },
    }
    for user in part(plan).users:
        key = user.identity
        out[f"mesh_user:{user.user}"] = {
            "identity": {"mode": "600", "owner": user.user, "sha256": _sha256(key.private)}
            if key
            else None,
            # the bytes operations/ssh_mesh_ops.py writes
            "identity_pub": {
                "mode": "644",
                "owner": user.user,
                "sha256": _sha256(key.public + "\n"),
            }
            if key
            else None,
            "authorized": {"block": list(user.authorized), "outside": []},
            "config": {"block": list(user.config), "outside": []},
            "certificate": user.certificate.rstrip("\n") if user.certificate else None,
        }
        out[f"mesh_proof:{user.user}"] = dict.fromkeys(pdsh.part(plan).nodes, "ok")
    return out


# The spec's section: `ssh`, a node's (SSH) and the cluster's (CLUSTER_SSH); trainfleet/schema.py
# composes the spec

SSH = Section(
    doc="How the controller (and the SSH mesh) reaches a node. Per node, override any key.",
    keys={
        "user": Key(
            str,
            "root",
            "User pyinfra connects as: root, or a user with passwordless sudo (`become: sudo`).",
            check=user_problem,
            accepts="user name: `[a-z_][a-z0-9_-]{0,31}`",
        ),
        "become": Key(
            (str, NULL),
            None,
            "`sudo`: every command, upload and check runs as root through the login user's "
            "passwordless sudo (`sudo -n`: a node that asks for a password fails with one clear "
            "error, never waits); null: `user` is root.",
            check=lambda v: None if v == "sudo" else f"{v!r} must be 'sudo' (or null)",
            accepts="`sudo`, or null",
        ),
        "port": Key(int, 22, "sshd port of the node.", check=port_problem, accepts="1-65535"),
        "key": Key(
            (str, NULL),
            None,
            "Private key the controller uses (path); null: ssh-agent / default keys.",
            check=controller_path_problem,
            accepts="controller path, one line",
        ),
        "known_hosts": Key(
            (str, NULL),
            None,
            "known_hosts file the controller verifies host keys against; null: ~/.ssh/known_hosts. "
            "Host-key checking is never switched off.",
            check=controller_path_problem,
            accepts="controller path, one line",
        ),
    },
)

MESH_MODES = ("certificates", "keys")

CLUSTER_SSH = Section(
    doc=SSH.doc + " `mesh` and `certificate_days` are cluster-wide.",
    keys={
        **SSH.keys,
        "mesh": Key(
            str,
            "certificates",
            "How the SSH mesh trusts: `certificates` (the cluster CA signs each node's host key "
            "and each mesh user's key; every node holds one CA line, whatever the cluster's size) "
            "or `keys` (every node's host key and public key on every node). Switching moves the "
            "mesh in one deploy.",
            check=lambda v: None if v in MESH_MODES else f"{v!r} must be 'certificates' or 'keys'",
            accepts="`certificates`, `keys`",
        ),
        "certificate_days": Key(
            int,
            365,
            "Validity of host and user certificates; the deploy signs them again once less "
            "than a third is left, and drift names a node whose certificate is in that last third.",
            check=lambda v: None if 1 <= v <= 3650 else f"must be 1 to 3650 days, got {v}",
            accepts="1-3650",
        ),
    },
)
