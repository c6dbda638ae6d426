"""The controller's store of SSH mesh keys: one ed25519 keypair per (cluster, user, node).

Keys are made with ``cryptography`` in OpenSSH format, written 0600 in directories
kept 0700 (``.trainfleet/`` is ignored by git), reused on every run so nothing
churns, and never printed. ``rotate`` replaces a node's key; ``revoke`` takes a node
out of every node's authorized_keys until it is rotated back in; ``retire_absent``
moves the keys of nodes no longer in the spec to ``retired/<timestamp>/``, so a node
added later under the same name gets a new key, not one from a disk since discarded.

During a run only the deploy's ``prepare_keys`` (trainfleet/key_preparation.py) writes it;
the plan, drift and the preflight read a ``snapshot``. Several trainfleet processes may share
a store (a deploy and ``keys rotate``, two deploys): every change, and every read that may
have to generate, holds the cluster's lock file, and files are written through unique temp
files renamed into place.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainfleet.controller_files import write_atomic
from trainfleet.key_material import (
    KeyMaterial,
    KeyPair,
    host_comment,
    host_key_changes,
    key_of,
)

DEFAULT_HOME = Path(__file__).resolve().parent.parent / ".trainfleet"
LOCK_NAME = ".lock"
CA_DIR = ".ca"  # <cluster>/.ca/ca{,.pub}: the cluster's SSH certificate authority
HOSTS_DIR = "hosts"  # <cluster>/.ca/hosts/<node>: the host keys the CA vouched for
CA_MOVING = "moving"  # <cluster>/.ca/moving: a new CA whose move is not confirmed on every node
REVOKED_LIST = (
    "revoked"  # <cluster>/.ca/revoked: every mesh key taken out (revoked, rotated, retired)
)
RETIRED = "retired"  # <cluster>/retired/<timestamp>/<user>/<node>{,.pub,.revoked}
LOCK_WAIT_S = 30.0  # a mutation takes milliseconds: waiting longer means a stuck process


_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


class KeyStoreError(RuntimeError):
    """The store cannot do what was asked; the message says why and what to do."""


class KeyStoreBusy(KeyStoreError):
    """Another process held the cluster's lock for longer than LOCK_WAIT_S."""


def store_root() -> Path:
    return Path(os.environ.get("TRAINFLEET_HOME", DEFAULT_HOME)) / "keys"


def controller_folder(name: str) -> Path:
    """A folder of the controller's own beside the key store (``reports``, ``captures``)."""
    return store_root().parent / name


class KeyStore:
    """Keys of one cluster: ``<root>/<cluster>/<user>/<node>{,.pub,.revoked}``.

    Making one writes nothing; ``snapshot`` reads it for the plan, drift and the preflight.
    Only the deploy's ``prepare_keys`` and the ``keys`` commands change it.
    """

    def __init__(self, cluster: str, root: Path | None = None):
        self.root = root or store_root()  # the store's own top directory: chmod stops here
        self.dir = self.root / cluster
        self._cache: dict[Path, tuple[tuple[int, int, int], KeyPair]] = {}

    def snapshot(self, users: Iterable[str], nodes: Iterable[str]) -> KeyMaterial:
        """What the store holds for these mesh users and nodes, read only: nothing is made,
        locked or rewritten (a key whose ``.pub`` is stale is read from its private half)."""
        users, nodes = list(users), list(nodes)
        pairs, revoked, missing = {}, set(), {}
        for user in users:
            lacking = []
            for node in nodes:
                if self.is_revoked(user, node):
                    revoked.add((user, node))
                    continue
                found = self._read_at(self._path(user, node), self.comment(user, node))
                if found is None:
                    lacking.append(node)
                else:
                    pairs[(user, node)] = found[0]
            missing[user] = tuple(lacking)
        ca = self._read_at(self.dir / CA_DIR / "ca", f"trainfleet:{self.dir.name}:ca")
        return KeyMaterial(
            cluster=self.dir.name,
            pairs=pairs,
            revoked=frozenset(revoked),
            missing=missing,
            ca=ca[0] if ca else None,
            ca_moving=self.ca_moving(),
            revoked_lines=tuple(self.revoked_keys()),
            host_keys={node: tuple(keys) for node, keys in self.host_keys().items()},
            retired_cas=tuple(self.retired_cas()),
        )

    def _path(self, user: str, node: str) -> Path:
        for name in (self.dir.name, user, node):  # each becomes one path component, never more
            if not _SAFE_NAME.fullmatch(name):
                raise KeyStoreError(f"{name!r} cannot name a key store entry")
        if user == RETIRED:
            raise KeyStoreError(
                f"a mesh user named {RETIRED!r} clashes with the store's {RETIRED}/ folder"
            )
        return self.dir / user / node

    def comment(self, user: str, node: str) -> str:
        return f"trainfleet:{self.dir.name}:{user}@{node}"

    def is_revoked(self, user: str, node: str) -> bool:
        return self._path(user, node).with_suffix(".revoked").exists()

    def keypair(self, user: str, node: str) -> KeyPair:
        """The node's key for ``user``, made on first use and reused afterwards."""
        return self._pair(self._path(user, node), self.comment(user, node))

    def certificate_authority(self) -> KeyPair:
        """The cluster's SSH certificate authority (``.ca/ca``: a folder no mesh user can be
        named, never retired), made on first use; it signs host and user certificates."""
        return self._pair(self.dir / CA_DIR / "ca", f"trainfleet:{self.dir.name}:ca")

    def ca_public(self) -> str | None:
        """The CA's public line, read only (None: the store has no CA; none is made)."""
        return _read_text(self.dir / CA_DIR / "ca.pub")

    def rotate_certificate_authority(self) -> Path | None:
        """A new cluster CA; the old one is moved to ``.ca/retired/<timestamp>/`` (returned; None
        when there was none). The next deploy trusts both while it signs every host and user
        anew, then drops the old one: after it, no node trusts a certificate the old CA signed,
        and once every node presents the new CA's certificates (``ca_settled``) the old private
        key leaves the store."""
        with self._locked():
            old = self.dir / CA_DIR / "ca"
            if not old.exists():
                self._generate_at(old, f"trainfleet:{self.dir.name}:ca")
                return None
            dest = _new_dir(self.dir / CA_DIR / RETIRED, self.root)
            for name in ("ca.pub", "ca"):  # the private key last: its absence means "no CA"
                if (old.parent / name).exists():
                    os.rename(old.parent / name, dest / name)
            self._cache.pop(old, None)
            _write_atomic(old.parent / CA_MOVING, b"")  # first: no moment with a new CA and no mark
            self._generate_at(old, f"trainfleet:{self.dir.name}:ca")
            return dest

    def ca_moving(self) -> bool:
        """A new CA was made (``rotate_certificate_authority``) and not every node presents its
        certificates yet: until then only a deploy of the whole cluster may move nodes to it."""
        return (self.dir / CA_DIR / CA_MOVING).exists()

    def ca_settled(self) -> None:
        """Every node presents certificates of the current CA: partial deploys are safe again, the
        private keys of retired CAs leave the store (their ``ca.pub`` stays, for the record):
        nothing may sign with them again, and they join the revoked list: no node accepts
        anything they signed."""
        with self._locked():
            self._revoke_lines(self.retired_cas())
            (self.dir / CA_DIR / CA_MOVING).unlink(missing_ok=True)
            for old in (self.dir / CA_DIR / RETIRED).glob("*/ca"):
                old.unlink()

    def retired_cas(self) -> list[str]:
        """The public lines of the CAs ``rotate_certificate_authority`` moved aside, oldest
        first (``.ca/retired/<time>/ca.pub``)."""
        top = self.dir / CA_DIR / RETIRED
        if not top.is_dir():
            return []
        found = (_read_text(path) for path in sorted(top.glob("*/ca.pub")))
        return [text.strip() for text in found if text and text.strip()]

    def revoke_retired_cas(self) -> list[str]:
        """Put every retired CA in the revoked list (a store whose CA move settled before they
        were revoked there); returns the lines added."""
        listed = {key_of(line) for line in self.revoked_keys()}
        fresh = [line for line in self.retired_cas() if key_of(line) not in listed]
        if not fresh or self.ca_moving():
            return []
        with self._locked():
            before = set(self.revoked_keys())
            self._revoke_lines(self.retired_cas())
            return [line for line in self.revoked_keys() if line not in before]

    def _pair(self, path: Path, comment: str) -> KeyPair:
        found = self._read_at(path, comment)
        if found is not None and found[1]:
            return found[0]
        with self._locked():  # another process may be making it right now
            found = self._read_at(path, comment)
            if found is None:
                return self._generate_at(path, comment)
            pair, public_ok = found
            if not public_ok:  # a .pub left by an older or interrupted writer: rewrite it
                _write_atomic(path.with_name(path.name + ".pub"), (pair.public + "\n").encode())
            return pair

    def revoked_keys(self) -> list[str]:
        """Every mesh public key ever taken out of the mesh (revoked, rotated away, retired with
        its node), oldest first: the KRL every node's sshd refuses them by, whatever certificate
        they still carry."""
        text = _read_text(self.dir / CA_DIR / REVOKED_LIST) or ""
        return [line for line in text.splitlines() if line.strip()]

    def host_keys(self) -> dict[str, list[str]]:
        """The host keys the CA has vouched for, per node (``.ca/hosts/<node>``)."""
        top = self.dir / CA_DIR / HOSTS_DIR
        if not top.is_dir():
            return {}
        return {
            path.name: [line for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(top.iterdir())
            if _SAFE_NAME.fullmatch(path.name)
        }

    def host_comment(self, node: str) -> str:
        """The comment of a node's host key in the revoked list (the key id of its certificates)."""
        return host_comment(self.dir.name, node)

    def record_host_keys(
        self,
        seen: dict[str, list[str]],
        nodes: Iterable[str],
        listed: Mapping[str, Iterable[str]] | None = None,
    ) -> list[str]:
        """Remember the host keys each node presents now (``seen``: ``type base64`` lines of the
        nodes read this run) and revoke those the CA vouched for that are gone: a reimaged
        node's old keys (one not read this run: when the controller's known_hosts, ``listed``,
        lists other keys for it), and every key of a node no longer in ``nodes``. Their
        certificates stay valid until they expire, so the KRL must refuse them. Returns the
        keys revoked.

        Revocation is monotone: a node presenting a key revoked before (removed from the spec,
        then added back as it was; a reimage rolled back) is not vouched for again, the plan
        names it; only ``readmit_host_keys`` (``keys readmit``, the operator's word) takes it
        back."""
        nodes = list(nodes)
        listed_now = self.revoked_keys()
        changed, gone, dropped = host_key_changes(self.host_keys(), seen, nodes, listed_now, listed)
        refused = {key_of(line) for line in listed_now}
        if not changed and not gone and all(key in refused for key, _ in dropped):
            return []  # the common case, without taking the lock
        with self._locked():
            changed, gone, revoked = host_key_changes(
                self.host_keys(), seen, nodes, self.revoked_keys(), listed
            )
            refused = {key_of(line) for line in self.revoked_keys()}
            revoked = [(key, node) for key, node in revoked if key not in refused]
            self._revoke_lines([f"{key} {self.host_comment(node)}" for key, node in revoked])
            top = self.dir / CA_DIR / HOSTS_DIR
            _private_dirs(top, self.root)
            for node, keys in changed.items():
                self._path("hosts", node)  # the node name's grammar, as for its mesh keys
                _write_atomic(top / node, "".join(f"{key}\n" for key in keys).encode())
            for node in gone:
                (top / node).unlink(missing_ok=True)
            return [key for key, _ in revoked]

    def revoked_host_keys(self, node: str) -> list[str]:
        """The revoked list's lines of host keys revoked under ``node``'s name."""
        self._path("hosts", node)  # the node name's grammar
        return [
            line for line in self.revoked_keys() if line.split()[2:] == [self.host_comment(node)]
        ]

    def readmit_host_keys(self, node: str, keys: Iterable[str]) -> list[str]:
        """Take the host ``keys`` (``type base64``) revoked under ``node``'s name (it left the
        spec, or a reimage replaced it) back out of the revoked list; the next deploy vouches
        for them if the node presents them. Every other revoked key stays revoked, whatever
        name it was revoked under. Returns the lines taken back. For keys known safe only:
        never a stolen one (``keys readmit`` takes the operator's fingerprints, or the keys the
        controller's known_hosts lists for the node)."""
        wanted = {key_of(key) for key in keys}
        with self._locked():
            listed = self.revoked_keys()
            back = [line for line in self.revoked_host_keys(node) if key_of(line) in wanted]
            if back:
                _write_atomic(
                    self.dir / CA_DIR / REVOKED_LIST,
                    "".join(f"{line}\n" for line in listed if line not in back).encode(),
                )
            return back

    def _add_revoked(self, paths: Iterable[Path]) -> None:
        """Add the public keys of these private key files to the revoked list; the caller holds
        the lock."""
        lines = []
        for path in paths:
            try:  # from the private key: a stale .pub must not revoke another key instead
                user, node = path.parent.name, path.name
                public = f"{_public_of(path.read_bytes(), path)} {self.comment(user, node)}"
            except FileNotFoundError:
                public = (_read_text(path.with_name(path.name + ".pub")) or "").strip()
            if public:
                lines.append(public)
        self._revoke_lines(lines)

    def _revoke_lines(self, lines: list[str]) -> None:
        """Add public key lines to the revoked list (each once); the caller holds the lock."""
        fresh: dict[str, str] = {}
        for line in lines:  # a key once, whatever its comment
            fresh.setdefault(key_of(line), line)
        known = {key_of(line) for line in self.revoked_keys()}
        lines = [line for key, line in fresh.items() if key not in known]
        if lines:
            _private_dirs(self.dir / CA_DIR, self.root)
            _write_atomic(
                self.dir / CA_DIR / REVOKED_LIST,
                "".join(f"{line}\n" for line in [*self.revoked_keys(), *lines]).encode(),
            )

    def rotate(self, user: str, node: str) -> None:
        """A new key for the node (and back into the mesh if it was revoked); the old one is
        revoked."""
        with self._locked():
            self._add_revoked([self._path(user, node)])
            self._generate_at(
                self._path(user, node), self.comment(user, node)
            )  # replaces the old pair in place
            self._path(user, node).with_name(node + ".revoked").unlink(missing_ok=True)

    def revoke(self, user: str, node: str) -> None:
        """Delete the node's key and keep it out of every authorized_keys."""
        path = self._path(user, node)
        with self._locked():
            _private_dirs(path.parent, self.root)
            self._add_revoked([path])  # first: its certificates stay refused whatever happens next
            _write_atomic(path.with_name(node + ".revoked"), b"")  # no window without key or mark
            for suffix in ("", ".pub"):
                path.with_name(node + suffix).unlink(missing_ok=True)

    def retire_absent(self, nodes: Iterable[str]) -> list[Path]:
        """Move the keys of nodes not in ``nodes`` to ``retired/<timestamp>/``; returns the new
        paths. The deploy's ``prepare_keys`` calls it; making a store never does."""
        keep = set(nodes)
        if not self._absent(keep):  # the common case, without taking the lock
            return []
        with self._locked():
            stale = self._absent(keep)
            if not stale:  # another process retired them meanwhile
                return []
            self._add_revoked([p for p in stale if not p.name.endswith((".pub", ".revoked"))])
            dest = _new_dir(self.dir / RETIRED, self.root)
            moved = []
            for path in stale:
                target = dest / path.parent.name / path.name
                _private_dirs(target.parent, self.root)
                os.rename(path, target)
                moved.append(target)
            self._cache.clear()
            return moved

    def retired(self) -> list[Path]:
        """Every retired key file, oldest retirement first."""
        top = self.dir / RETIRED
        if not top.is_dir():
            return []
        return sorted(p for p in top.glob("*/*/*") if p.is_file())

    def _absent(self, keep: set[str]) -> list[Path]:
        """Key files (private, .pub, .revoked) of nodes not in ``keep``; temp and lock files are
        not keys."""
        if not self.dir.is_dir():
            return []
        stale = []
        for user_dir in self.dir.iterdir():
            if user_dir.name == RETIRED or user_dir.name.startswith(".") or not user_dir.is_dir():
                continue
            for path in user_dir.iterdir():
                if not path.name.startswith(".") and _node_of(path.name) not in keep:
                    stale.append(path)
        return sorted(stale)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """The cluster's lock (fcntl.flock: released by the kernel if the holder dies).

        Held only around file work that never yields to another greenlet, so the hosts of one
        pyinfra run never wait on each other for it; only other processes do.
        """
        _private_dirs(self.dir, self.root)
        lock = self.dir / LOCK_NAME
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise KeyStoreBusy(
                            f"another trainfleet process has held the key store lock {lock} "
                            f"for over {LOCK_WAIT_S:.0f}s; let it finish (or end it) and run again"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read_at(self, path: Path, comment: str) -> tuple[KeyPair, bool] | None:
        """The stored pair and whether its .pub file matches. The public half is always derived
        from the private key, so no writer, old or interrupted, can pair it with another one."""
        try:
            with open(path, "rb") as handle:
                st = os.fstat(handle.fileno())
                seen = (st.st_ino, st.st_mtime_ns, st.st_size)
                cached = self._cache.get(path)
                if cached and cached[0] == seen:
                    return cached[1], True
                private = handle.read()
        except FileNotFoundError:
            return None
        pair = KeyPair(private=private.decode(), public=f"{_public_of(private, path)} {comment}")
        public_ok = _read_text(path.with_name(path.name + ".pub")) == pair.public + "\n"
        if public_ok:
            self._cache[path] = (seen, pair)
        return pair, public_ok

    def _generate_at(self, path: Path, comment: str) -> KeyPair:
        """Make and store a new pair at ``path`` (and ``path``.pub); the caller holds the lock."""
        _private_dirs(path.parent, self.root)
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        line = f"{public.decode()} {comment}"
        _write_atomic(path.with_name(path.name + ".pub"), (line + "\n").encode())
        _write_atomic(path, private)  # last: its presence means the pair is complete
        _fsync_dir(path.parent)
        self._cache.pop(path, None)
        return KeyPair(private=private.decode(), public=line)


def _node_of(name: str) -> str:
    for suffix in (".pub", ".revoked"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _public_of(private: bytes, path: Path) -> str:
    """``ssh-ed25519 AAAA...`` of an OpenSSH private key (the error names the file, never its
    text)."""
    try:
        key = serialization.load_ssh_private_key(private, password=None)
    except (ValueError, TypeError):
        raise KeyStoreError(
            f"{path} is not an unencrypted OpenSSH private key; "
            "replace it with `python -m trainfleet keys rotate SPEC NODE`"
        ) from None
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _private_dirs(path: Path, top: Path) -> None:
    """Create ``path`` and make it and every directory between it and ``top`` (the store's
    own ``keys/``, included) 0700. Never anything above ``top``: TRAINFLEET_HOME and its
    parents belong to the operator."""
    if path != top and top not in path.parents:
        raise KeyStoreError(f"{path} is outside the key store {top}")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for part in [path, *path.parents]:
        os.chmod(part, 0o700)
        if part == top:
            break


def _new_dir(parent: Path, top: Path) -> Path:
    """A fresh ``parent/<UTC timestamp>[-n]`` directory, 0700."""
    _private_dirs(parent, top)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in range(1000):
        candidate = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            candidate.mkdir(mode=0o700)
            return candidate
        except FileExistsError:
            continue
    raise KeyStoreError(f"cannot make a new folder in {parent}")


def _write_atomic(path: Path, data: bytes) -> None:
    """A file of the store, root's alone (0600) like every other, a public key's included."""
    write_atomic(path, data, mode=0o600)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
