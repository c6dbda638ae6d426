"""The key store as the plan sees it: a read-only snapshot, plain data.

``KeyStore.snapshot`` reads it (never writing: no lock file, no folder, no ``.pub`` rewrite);
``trainfleet.key_preparation.prepare_keys``, the deploy's one step that writes the store,
returns one. The plan, drift and the preflight take this and nothing else of the store: a key
or a CA it lacks is a problem in the plan, never a key made on the spot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

RUN_THE_DEPLOY = "run the deploy (pyinfra INVENTORY deploy/cluster.py)"
NO_CA = f"the key store has no cluster CA yet: {RUN_THE_DEPLOY}"
NAMES_SHOWN = 5  # missing keys named in a problem; the rest are counted


@dataclass(frozen=True)
class KeyPair:
    private: str  # OpenSSH PEM; never logged
    public: str  # "ssh-ed25519 AAAA... comment"

    def __repr__(self) -> str:  # keep the private half out of tracebacks and debug logs
        return f"KeyPair(public={self.public!r})"

    __str__ = __repr__


@dataclass(frozen=True)
class KeyMaterial:
    """One cluster's key store at one moment, for the nodes and mesh users it was read for.

    + pairs: ``(user, node) -> KeyPair`` of every key present and not revoked
    + revoked: the ``(user, node)`` keys taken out of the mesh (``keys revoke``)
    + missing: ``user -> nodes`` whose key is neither present nor revoked
    + ca: the cluster CA (None: the store has none yet)
    + ca_moving: a new CA whose move is not confirmed on every node (``keys rotate-ca``)
    + revoked_lines: every mesh and host key taken out, oldest first (the KRL's content)
    + host_keys: ``node -> keys`` the CA has vouched for (``type base64``)
    + retired_cas: the public lines of every CA ``keys rotate-ca`` replaced, oldest first
    """

    cluster: str
    pairs: Mapping[tuple[str, str], KeyPair] = field(default_factory=dict)
    revoked: frozenset[tuple[str, str]] = frozenset()
    missing: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    ca: KeyPair | None = None
    ca_moving: bool = False
    revoked_lines: tuple[str, ...] = ()
    host_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    retired_cas: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"KeyMaterial({self.cluster!r}, {len(self.pairs)} keys, ca={self.ca!r})"

    def keypair(self, user: str, node: str) -> KeyPair | None:
        """The node's key for ``user``; None when revoked or missing."""
        return self.pairs.get((user, node))

    def is_revoked(self, user: str, node: str) -> bool:
        return (user, node) in self.revoked

    def revoked_keys(self) -> list[str]:
        return list(self.revoked_lines)

    def presenting(
        self,
        seen: Mapping[str, list[str]],
        nodes: Iterable[str],
        listed: Mapping[str, Iterable[str]] | None = None,
    ) -> KeyMaterial:
        """This material once the deploy has recorded the host keys ``seen`` (``node -> keys``
        read this run) for a cluster of ``nodes`` (``listed``: the controller's known_hosts keys
        of the nodes not read): the keys the CA vouched for that are gone (a reimaged node's, a
        removed node's) are revoked too. Itself where nothing is gone, as after the deploy's
        ``prepare_keys``. Nothing is written: drift expects what the next deploy will do."""
        _, _, gone = host_key_changes(self.host_keys, seen, nodes, self.revoked_lines, listed)
        revoked = {key_of(line) for line in self.revoked_lines}
        fresh: dict[str, str] = {}
        for key, node in gone:
            if key not in revoked:
                fresh.setdefault(key, f"{key} {host_comment(self.cluster, node)}")
        if not fresh:
            return self
        return replace(self, revoked_lines=(*self.revoked_lines, *fresh.values()))

    def settled(self) -> KeyMaterial:
        """This material once the CA move has settled (every node presents the new CA's
        certificates): the retired CAs are revoked too, so the KRL refuses whatever they signed.
        Nothing is written: the deploy's ``prepare_keys`` does the same to the store."""
        lines = with_retired_cas(self.revoked_lines, self.retired_cas)
        return replace(self, ca_moving=False, revoked_lines=lines)

    def missing_problems(self, user: str, nodes: list[str] | None = None) -> list[str]:
        """Why a part that needs ``user``'s keys of ``nodes`` (None: of every node read)
        cannot be planned: keys the store lacks (none: ``[]``)."""
        lacking = self.missing.get(user, ())
        if nodes is not None:
            wanted = set(nodes)
            lacking = tuple(node for node in lacking if node in wanted)
        if not lacking:
            return []
        named = ", ".join(lacking[:NAMES_SHOWN])
        more = len(lacking) - NAMES_SHOWN
        named += f" and {more} more" if more > 0 else ""
        return [f"the key store has no {user} key for {named} yet: {RUN_THE_DEPLOY}"]


def key_of(line: str) -> str:
    """``type base64`` of a public key line: what revocation compares, whatever the comment."""
    return " ".join(line.split()[:2])


def with_retired_cas(revoked: Iterable[str], retired_cas: Iterable[str]) -> tuple[str, ...]:
    """The revoked list with every retired CA's key added once (``KeyStore.revoke_retired_cas``
    appends the same lines the same way)."""
    lines = list(revoked)
    listed = {key_of(line) for line in lines}
    for line in retired_cas:
        if key_of(line) not in listed:
            listed.add(key_of(line))
            lines.append(line)
    return tuple(lines)


def host_comment(cluster: str, node: str) -> str:
    """The comment of a node's host key in the revoked list (the key id of its certificates)."""
    return f"trainfleet:{cluster}:host:{node}"


def host_key_changes(
    known: Mapping[str, Iterable[str]],
    seen: Mapping[str, list[str]],
    nodes: Iterable[str],
    revoked: Iterable[str],
    listed: Mapping[str, Iterable[str]] | None = None,
) -> tuple[dict[str, list[str]], list[str], list[tuple[str, str]]]:
    """What recording the host keys ``seen`` (``node -> keys`` read this run) changes when the CA
    vouched for ``known`` and ``revoked`` lists the keys taken out: ``(node -> keys to vouch
    for now, nodes no longer in ``nodes``, (key, node) of every vouched key that is gone)``.

    ``listed``: the keys the controller's known_hosts lists for nodes not read this run (what
    pyinfra will verify them by). A node whose vouched keys are none of those was given new host
    keys while it could not be read (a cluster reinstalled, one node down): its old keys are gone
    now, not only once it is back, so a late node's return changes no other node's KRL.

    A key revoked before is not vouched for again (revocation is monotone)."""
    keep = set(nodes)
    refused = {key_of(line) for line in revoked}
    vouched = {
        node: sorted({key_of(key) for key in keys} - refused)
        for node, keys in seen.items()
        if keys and node in keep
    }
    changed = {node: keys for node, keys in vouched.items() if keys != list(known.get(node, []))}
    gone = [node for node in known if node not in keep]
    dropped = [(key, node) for node in gone for key in known[node]]
    dropped += [
        (key, node)
        for node, keys in changed.items()
        for key in known.get(node, [])
        if key not in keys
    ]
    dropped += [
        (key, node)
        for node in replaced_while_unread(known, seen, keep, listed or {})
        for key in known[node]
    ]
    return changed, gone, dropped


def replaced_while_unread(
    known: Mapping[str, Iterable[str]],
    seen: Mapping[str, list[str]],
    keep: set[str],
    listed: Mapping[str, Iterable[str]],
) -> list[str]:
    """Nodes of the spec not read this run whose vouched host keys the controller's known_hosts
    no longer lists at all (it lists others): a node that comes back presents the listed ones or
    is refused by pyinfra, so the vouched ones are gone. A node it lists nothing for, or one of
    the vouched keys for, is left as it is (a partial listing is not a reimage)."""
    out = []
    for node, vouched in known.items():
        keys = {key_of(key) for key in listed.get(node, ())}
        if node in keep and not seen.get(node) and keys and not keys & set(vouched):
            out.append(node)
    return out
