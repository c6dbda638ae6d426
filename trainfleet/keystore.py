"""The controller's store of SSH mesh keys: one ed25519 keypair per (cluster, user, node).

Keys are made with ``cryptography`` in OpenSSH format, written 0600 in a directory
created 0700 (``.trainfleet/`` is ignored by git), reused on every run so nothing
churns, and never printed. ``rotate`` replaces a node's key; ``revoke`` takes a node
out of every node's authorized_keys until it is rotated back in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

DEFAULT_HOME = Path(__file__).resolve().parent.parent / ".trainfleet"


def store_root() -> Path:
    return Path(os.environ.get("TRAINFLEET_HOME", DEFAULT_HOME)) / "keys"


@dataclass(frozen=True)
class KeyPair:
    private: str  # OpenSSH PEM; never logged
    public: str  # "ssh-ed25519 AAAA... comment"

    def __repr__(self) -> str:  # keep the private half out of tracebacks and debug logs
        return f"KeyPair(public={self.public!r})"


class KeyStore:
    """Keys of one cluster: ``<root>/<cluster>/<user>/<node>{,.pub,.revoked}``."""

    def __init__(self, cluster: str, root: Path | None = None):
        self.dir = (root or store_root()) / cluster

    def _path(self, user: str, node: str) -> Path:
        return self.dir / user / node

    def comment(self, user: str, node: str) -> str:
        return f"trainfleet:{self.dir.name}:{user}@{node}"

    def is_revoked(self, user: str, node: str) -> bool:
        return self._path(user, node).with_suffix(".revoked").exists()

    def keypair(self, user: str, node: str) -> KeyPair:
        """The node's key for ``user``, made on first use and reused afterwards."""
        path = self._path(user, node)
        if not path.exists():
            self._generate(user, node)
        return KeyPair(private=path.read_text(), public=path.with_name(node + ".pub").read_text().strip())

    def rotate(self, user: str, node: str) -> None:
        """A new key for the node (and back into the mesh if it was revoked)."""
        for suffix in ("", ".pub", ".revoked"):
            self._path(user, node).with_name(node + suffix).unlink(missing_ok=True)
        self._generate(user, node)

    def revoke(self, user: str, node: str) -> None:
        """Delete the node's key and keep it out of every authorized_keys."""
        for suffix in ("", ".pub"):
            self._path(user, node).with_name(node + suffix).unlink(missing_ok=True)
        _private_dirs(self._path(user, node).parent)
        self._path(user, node).with_name(node + ".revoked").touch(mode=0o600)

    def _generate(self, user: str, node: str) -> None:
        path = self._path(user, node)
        _private_dirs(path.parent)
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        _write_new(path.with_name(node + ".pub"), public + f" {self.comment(user, node)}\n".encode())
        _write_new(path, private)  # last: its presence means the pair is complete


def _private_dirs(path: Path) -> None:
    """Create ``path`` and make it and every store dir above it 0700."""
    top = store_root().parent
    path.mkdir(parents=True, exist_ok=True)
    for part in [path, *path.parents]:
        os.chmod(part, 0o700)
        if part == top or top not in part.parents:
            break


def _write_new(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
