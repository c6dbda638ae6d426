"""The SSH mesh as data: who trusts whom, and which host keys every node must know.

Plain functions of the cluster model, a snapshot of the key store (``KeyMaterial``: read
only, nothing made here) and gathered host keys; the operations in
operations/ssh_mesh_ops.py only put these lines in place.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import paramiko
from cryptography.hazmat.primitives import serialization

from trainfleet import certificates, krl
from trainfleet.defaults import HOST_CERT_SUFFIX, RENEW_FRACTION
from trainfleet.key_material import KeyMaterial, KeyPair
from trainfleet.model import Cluster, Node
from trainfleet.text import printable


def host_patterns(node: Node) -> list[str]:
    """known_hosts names for a node: short name, FQDN and address (``[h]:port`` off port 22)."""
    names = [node.name, *([node.fqdn] if node.fqdn else []), node.address]
    port = node.ssh["port"]
    return names if port == 22 else [f"[{name}]:{port}" for name in names]


def known_hosts_lines(cluster: Cluster, host_keys: dict[str, list[str]]) -> list[str]:
    """One line per node and key type, for every node whose host keys are known."""
    return [
        f"{','.join(host_patterns(node))} {key}"
        for node in cluster.nodes
        for key in host_keys.get(node.name, [])
    ]


def authorized_lines(cluster: Cluster, user: str, keys: KeyMaterial) -> list[str]:
    """Every cluster node's public key for ``user`` (revoked nodes left out, and keys the store
    lacks: the plan names those, ``KeyMaterial.missing_problems``), node order."""
    return [pair.public for node in cluster.nodes if (pair := keys.keypair(user, node.name))]


def identity(user: str, node: Node, keys: KeyMaterial) -> KeyPair | None:
    """The key the node uses to reach its peers; None once revoked (or missing from the store)."""
    return keys.keypair(user, node.name)


def cluster_host_keys(
    cluster: Cluster, gathered: dict[str, list[str]]
) -> tuple[dict[str, list[str]], list[str]]:
    """(every node's host keys, the nodes whose keys came from the controller's known_hosts).

    A node that gave none this run (down, unreadable) keeps its entry from the controller's
    known_hosts, which pyinfra itself verified it against before. The deploy writes these
    and drift expects these.
    """
    keys = {name: found for name, found in gathered.items() if found}
    fallback = [node.name for node in cluster.nodes if node.name not in keys]
    for node in cluster.nodes:
        if node.name in fallback:
            keys[node.name] = controller_known_keys(
                node.address, node.ssh["port"], node.ssh["known_hosts"]
            )
    return keys, fallback


def controller_known_keys(
    address: str, port: int, known_hosts: str | None, files: dict[Path, Any] | None = None
) -> list[str]:
    """A node's host keys in the controller's known_hosts (``type base64``, sorted): what
    pyinfra verifies it by. ``files``: parsed files to reuse (path -> paramiko.HostKeys)."""
    path = Path(known_hosts or "~/.ssh/known_hosts").expanduser()
    files = {} if files is None else files
    if path not in files:
        files[path] = _known_hosts(path)
    if files[path] is None:
        return []
    entry = files[path].lookup(host_name(address, port))
    return sorted(f"{k.get_name()} {k.get_base64()}" for k in (entry or {}).values())


def host_name(address: str, port: int) -> str:
    """A host as known_hosts and ssh name it: ``[address]:port`` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def _known_hosts(path: Path) -> paramiko.HostKeys | None:
    """The controller's known_hosts at ``path`` parsed (None: there is none); a line paramiko
    cannot parse is a KnownHostsError naming it, never a traceback."""
    if not path.exists():
        return None
    known_hosts_problem(path, raising=True)
    return paramiko.HostKeys(str(path))


def every_listed_key(address: str, port: int, known_hosts: str | None) -> list[str]:
    """Every host key the controller's known_hosts lists for a node (``type base64``, sorted),
    two of one type included (paramiko's lookup keeps one per type)."""
    keys = _known_hosts(Path(known_hosts or "~/.ssh/known_hosts").expanduser())
    if keys is None:
        return []
    name = host_name(address, port)
    found = set()
    # the one way to see a second key of a type: paramiko's own list of lines
    for entry in keys._entries:  # type: ignore[attr-defined]
        for listed in entry.hostnames:
            hashed = listed.startswith("|1|") and keys.hash_host(name, listed) == listed
            if (hashed or listed == name) and entry.key is not None:
                found.add(f"{entry.key.get_name()} {entry.key.get_base64()}")
    return sorted(found)


class KnownHostsError(ValueError):
    """A known_hosts file the controller cannot read, named with the line at fault."""


def known_hosts_problem(path: Path, raising: bool = False) -> str | None:
    """Why the controller's known_hosts at ``path`` cannot be read (``path:line: why``), or
    None. paramiko skips a line it cannot parse only when it raises SSHException; a bad
    base64 key (InvalidHostKey) or bytes that are not UTF-8 would escape as a traceback."""
    if not path.exists():
        return None
    problem = None
    text = b""
    try:
        text = path.read_bytes()
        for number, line in enumerate(text.decode().splitlines(), 1):
            try:
                paramiko.hostkeys.HostKeyEntry.from_line(line, number)
            except paramiko.hostkeys.InvalidHostKey as exc:
                problem = f"{path}:{number}: not a host key line ({printable(str(exc.exc))})"
                break
            except paramiko.SSHException:
                continue  # paramiko skips it too
    except UnicodeDecodeError as exc:
        at = text[: exc.start].count(b"\n") + 1
        problem = f"{path}:{at}: not UTF-8 text"
    except OSError as exc:
        problem = f"{path}: cannot be read ({exc.strerror})"
    if problem and raising:
        raise KnownHostsError(problem)
    return problem


def unread_host_keys(cluster: Cluster, read: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The host keys the controller's known_hosts lists for every node that gave none this run
    (``read``: ``node -> keys`` of the nodes read): the keys it will present when it is back,
    or pyinfra refuses it."""
    files: dict[Path, Any] = {}
    return {
        node.name: controller_known_keys(
            node.address, node.ssh["port"], node.ssh["known_hosts"], files
        )
        for node in cluster.nodes
        if not read.get(node.name)
    }


FULL_PROBE_ENV = (
    "TRAINFLEET_DRIFT_MESH"  # "full": drift's probe logs in from every node to every node
)
STRIDE_ENV = (
    "TRAINFLEET_DRIFT_STRIDE"  # pin the sampled probe's stride (2..N-1) instead of rotating it
)


def probe_env_problems(nodes: int, env: Mapping[str, str]) -> list[str]:
    """What is wrong with the probe settings in ``env`` for a cluster of ``nodes`` (checked
    when the inventory loads, before any host is contacted)."""
    problems = []
    if env.get(FULL_PROBE_ENV, "") not in ("", "full", "sampled"):
        problems.append(f"{FULL_PROBE_ENV} is {env[FULL_PROBE_ENV]!r}: use full or sampled")
    pinned = env.get(STRIDE_ENV, "")
    if pinned and (
        not (pinned.isascii() and pinned.isdigit()) or not 2 <= int(pinned) <= max(2, nodes - 1)
    ):
        problems.append(
            f"{STRIDE_ENV} is {pinned!r}: a stride is 2..{max(2, nodes - 1)} for {nodes} nodes"
        )
    return problems


def probe_stride(nodes: int, rotation: int) -> int:
    """The stride of drift's sampled mesh probe, one step further each run (``rotation``):
    2..N-1, so over N-2 runs every ordered pair of nodes is probed once (below four nodes
    the ring and the stride already reach every peer)."""
    return min(nodes - 1, 2) if nodes < 4 else 2 + rotation % (nodes - 2)


def probe_targets(names: list[str], node: str, stride: int) -> list[str]:
    """The peers ``node`` probes: its successor in the ring and the node ``stride`` places on,
    so every node is probed as source and as target by a constant number of logins per node
    (one node: itself). Stride 0: every node, itself included (the full N x N probe)."""
    if not stride:
        return list(names)
    at = names.index(node)
    return list(dict.fromkeys(names[(at + step) % len(names)] for step in (1, stride)))


# -- certificates (ssh.mesh: certificates) ------------------------------------------------------


def host_principals(node: Node) -> list[str]:
    """The names a node's host certificate vouches for: short name, FQDN and cluster address,
    lower-case (ssh lower-cases the name it is given before checking a certificate)."""
    return list(
        dict.fromkeys(
            name.lower() for name in [node.name, *([node.fqdn] if node.fqdn else []), node.address]
        )
    )


def name_pattern(name: str) -> str:
    """An ssh host pattern for a family of names: the digits of a name's first label (of an IPv4
    address's last octet, an IPv6 address's last group) become ``?`` — ``gpu-a01``,
    ``gpu-a01.cluster.example.com``, ``192.0.2.11`` give ``gpu-a??``,
    ``gpu-a??.cluster.example.com``, ``192.0.2.??``: one pattern per naming scheme, however many
    nodes follow it."""
    if ":" in name:  # IPv6
        head, _, last = name.rpartition(":")
        return f"{head}:{'?' * len(last)}" if last else name
    labels = name.split(".")
    if len(labels) == 4 and all(label.isdigit() for label in labels):  # IPv4
        return ".".join(labels[:3] + ["?" * len(labels[3])])
    return ".".join([re.sub(r"[0-9]", "?", labels[0]), *labels[1:]])


def pattern_matches(pattern: str, name: str) -> bool:
    """ssh's host pattern match (``*``, ``?``; case-insensitive)."""
    return fnmatch.fnmatchcase(name.lower(), pattern.lower().replace("[", "[[]"))


def cluster_patterns(cluster: Cluster, addresses: bool = True) -> list[tuple[int, list[str]]]:
    """``[(port, patterns)]``: ssh host patterns matching the cluster's names (short, FQDN and,
    with ``addresses``, address), one group per sshd port. A group whose patterns would also
    match a node of another port lists its names as they are instead.

    ``~/.ssh/config`` takes them without addresses: its block comes first and sets User, Port
    and the key, so an address pattern (``10.0.0.?``) would take the user's own entries for
    other hosts of the subnet (a gateway); the mesh's tools reach nodes by name."""
    names: dict[int, list[str]] = {}
    for (
        node
    ) in cluster.nodes:  # as written too: ssh matches a Host pattern against the name as typed
        written = [node.name, *([node.fqdn] if node.fqdn else [])]
        principals = host_principals(node) if addresses else [n.lower() for n in written]
        names.setdefault(node.ssh["port"], []).extend(dict.fromkeys([*principals, *written]))
    groups = []
    for port, mine in names.items():
        patterns = list(dict.fromkeys(name_pattern(n) for n in mine))
        others = [n for p, theirs in names.items() if p != port for n in theirs]
        if any(pattern_matches(pattern, other) for pattern in patterns for other in others):
            patterns = mine
        groups.append((port, patterns))
    return groups


def ca_known_hosts_lines(cluster: Cluster, ca_public: str) -> list[str]:
    """The system known_hosts block: one ``@cert-authority`` line per sshd port in the cluster."""
    key = " ".join(ca_public.split()[:2])
    return [
        f"@cert-authority {','.join(p if port == 22 else f'[{p}]:{port}' for p in patterns)} {key} "
        f"trainfleet:{cluster.name}:ca"
        for port, patterns in cluster_patterns(cluster)
    ]


def ca_authorized_line(cluster: Cluster, user: str, ca_public: str) -> str:
    """The one authorized_keys line that lets every node in as ``user``: certificates the
    cluster CA signed for the principal ``user`` (and for no other account)."""
    return (
        f'cert-authority,principals="{user}" {" ".join(ca_public.split()[:2])} '
        f"trainfleet:{cluster.name}:ca"
    )


@dataclass(frozen=True)
class Certificates:
    """What a cluster needs of its CA this run (``plan_certificates``)."""

    ca_public: str
    ca: Any  # the CA's private key (Ed25519PrivateKey); never logged
    validity: timedelta
    now: datetime
    revoked_keys: bytes  # the KRL every node's sshd reads
    revoked_count: int
    moving: bool = False  # a new CA not yet presented by every node (KeyMaterial.ca_moving)
    revoked: frozenset[str] = frozenset()  # ``type base64`` of every revoked mesh key
    # moving: the KRL once the move settles (the retired CAs revoked too); None: not moving
    settled_revoked_keys: bytes | None = None

    def __repr__(self) -> str:
        return f"Certificates(ca_public={self.ca_public!r}, revoked={self.revoked_count})"

    @property
    def renew_before(self) -> timedelta:
        return self.validity / RENEW_FRACTION

    def certificate(
        self, current: str | None, public_line: str, kind: str, principals: list[str], key_id: str
    ) -> str:
        """``current`` if it is this CA's, for this key and these principals and not yet due for
        renewal; else a new one."""
        if (
            current
            and certificates.needs_renewal(
                current, public_line, self.ca_public, principals, self.renew_before, self.now, kind
            )
            is None
            and certificates.read(current).time_left(self.now)
            <= self.validity + certificates.BACKDATE
        ):
            return current  # (one that outlives a validity the spec has shortened is signed anew)
        return certificates.sign(
            self.ca,
            public_line,
            kind,
            principals,
            key_id,
            secrets.randbits(63) | 1,
            self.validity,
            self.now,
        )


def plan_certificates(
    cluster: Cluster, keys: KeyMaterial, now: datetime | None = None
) -> Certificates | None:
    """The cluster CA, its validity and the KRL of every revoked mesh key (None: the store has
    no CA yet; the plan names that, ``key_material.NO_CA``)."""
    ca = keys.ca
    if ca is None:
        return None
    revoked = keys.revoked_keys()
    return Certificates(
        ca_public=ca.public,
        ca=serialization.load_ssh_private_key(ca.private.encode(), password=None),
        validity=timedelta(days=cluster.certificate_days),
        now=now or datetime.now(UTC),
        revoked_keys=revocation_list(cluster, revoked),
        revoked_count=len(revoked),
        moving=keys.ca_moving,
        revoked=frozenset(" ".join(line.split()[:2]) for line in revoked),
        settled_revoked_keys=revocation_list(cluster, keys.settled().revoked_keys())
        if keys.ca_moving
        else None,
    )


def revocation_list(cluster: Cluster, revoked: list[str]) -> bytes:
    """The KRL of these revoked lines: bytes that depend on the list alone (not on a file's
    time), so a copied store changes nothing."""
    return krl.build(
        None, [], revoked, version=len(revoked), generated=0, comment=f"trainfleet:{cluster.name}"
    )


def settles(cluster: Cluster, gathered: Any, ca_public: str, keys: KeyMaterial) -> bool:
    """Whether a CA move is over: every node was read (``gathered``: the plan's ``Gathered``)
    and presents host certificates of ``ca_public`` and no other's, and root (where it is a
    mesh user with a key) a user certificate of it: what only root writes. Another mesh user's
    certificate is left out: that user can hold it back (a step in its home failing every run),
    and whoever still presents one of the old CA's is its own node's loss, not the cluster's."""
    if not {n.name for n in cluster.nodes} <= set(gathered.sshd):
        return False
    root = "root" in cluster.mesh_users
    for node in cluster.nodes:
        held = [line for line in gathered.sshd[node.name]["certificates"].values() if line]
        if not held:
            return False
        if root and not keys.is_revoked("root", node.name):
            held.append(gathered.user_certificates.get(node.name, {}).get("root"))
        if not all(signed_by(line, ca_public) for line in held):
            return False
    return True


def signed_by(line: str | None, ca_public: str) -> bool:
    """Whether the certificate ``line`` names ``ca_public`` as its signer."""
    try:
        return line is not None and certificates.read(
            line
        ).ca_fingerprint == certificates.fingerprint(ca_public)
    except certificates.CertificateError:
        return False


def host_cert_path(key_type: str) -> str | None:
    """Where sshd finds the certificate of its host key of this type (None: not a host key type)."""
    short = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa", "ssh-dss": "dsa"}.get(key_type)
    if short is None and key_type.startswith("ecdsa-sha2-"):
        short = "ecdsa"
    return f"/etc/ssh/ssh_host_{short}_key{HOST_CERT_SUFFIX}" if short else None


CERTIFIED_HOST_KEY_TYPES = ("ssh-ed25519", "ssh-rsa")  # in order of preference: one is certified


def certified_host_key(host_keys: list[str]) -> str | None:
    """The one host key the CA vouches for: the ed25519 key, RSA where there is none (a
    certificate for every key sshd has would widen what it offers: an ECDSA or DSA one)."""
    by_type = {key.split()[0]: key for key in host_keys if key.split()}
    return next((by_type[kind] for kind in CERTIFIED_HOST_KEY_TYPES if kind in by_type), None)


def host_certificates(
    cluster: Cluster,
    node: Node,
    host_keys: list[str],
    current: Mapping[str, str | None],
    certs: Certificates,
) -> dict[str, str]:
    """``{path: certificate line}`` of the node's certified host key (none: it has no ed25519 or
    RSA key): kept while valid, signed anew otherwise."""
    key = certified_host_key(host_keys)
    path = host_cert_path(key.split()[0]) if key else None
    if not key or not path:
        return {}
    return {
        path: certs.certificate(
            current.get(path),
            key,
            "host",
            host_principals(node),
            f"trainfleet:{cluster.name}:host:{node.name}",
        )
        + "\n"
    }


def certificate_summary(line: str | None) -> str:
    """A certificate as drift shows it: what it vouches for, until when, signed by which CA
    (``absent``: no certificate)."""
    if not line:
        return "absent"
    try:
        info = certificates.read(line)
    except certificates.CertificateError as exc:
        return f"unreadable ({exc})"
    return (
        f"{'' if info.signed else 'BAD SIGNATURE: '}{info.kind} {','.join(info.principals)} "
        f"until {info.valid_before:%Y-%m-%d %H:%M} UTC, CA {info.ca_fingerprint[:19]}"
    )


def host_certificates_summary(found: Mapping[str, str | None]) -> str:
    """Every host certificate sshd would present, one summary each (``none``: none)."""
    return (
        "; ".join(
            f"{path.rsplit('/', 1)[-1]}: {certificate_summary(line)}"
            for path, line in sorted(found.items())
            if line
        )
        or "none"
    )


def file_digest(content: bytes | str | None) -> str:
    """A short sha256 of a file's bytes (``absent``: no file)."""
    if content is None:
        return "absent"
    data = content.encode() if isinstance(content, str) else content
    return hashlib.sha256(data).hexdigest()[:12]


def sshd_files_digest(drop_in: bytes | str | None, revoked_keys: bytes | None) -> str:
    """trainfleet's sshd drop-in and KRL, as one comparable value."""
    if drop_in is None and revoked_keys is None:
        return "absent"
    return f"drop-in {file_digest(drop_in)}, revoked keys {file_digest(revoked_keys)}"
