"""OpenSSH key revocation lists (KRL, the binary format of OpenSSH's PROTOCOL.krl), written on
the controller: sshd's ``RevokedKeys`` and ssh's ``RevokedHostKeys`` read them on every node.

A KRL here revokes certificates by serial under the cluster's CA, and plain keys by their
SHA256 hash; its size depends on what is revoked, never on how many nodes the cluster has.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable

MAGIC = b"SSHKRL\n\0"
FORMAT_VERSION = 1
SECTION_CERTIFICATES = 1
SECTION_FINGERPRINT_SHA256 = 5
CERT_SERIAL_LIST = 0x20


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _key_blob(public_line: str) -> bytes:
    try:
        return base64.b64decode(public_line.split()[1], validate=True)
    except (IndexError, ValueError) as exc:
        raise ValueError(f"not an OpenSSH public key line: {public_line[:40]!r} ({exc})") from None


def build(
    ca_public: str | None,
    serials: Iterable[int],
    keys: Iterable[str],
    version: int,
    generated: int,
    comment: str = "trainfleet",
) -> bytes:
    """The KRL revoking the certificates numbered ``serials`` that ``ca_public`` signed and the
    plain ``keys`` (OpenSSH public key lines). ``version`` numbers this KRL (it should grow
    with every change); ``generated`` is its time (seconds since the epoch)."""
    serials = sorted(set(serials))
    if any(not 0 < s < 2**64 for s in serials):
        raise ValueError("certificate serials are 1..2^64-1")
    body = (
        MAGIC
        + struct.pack(">IQQQ", FORMAT_VERSION, version, generated, 0)
        + _string(b"")
        + _string(comment.encode())
    )
    if serials:
        if not ca_public:
            raise ValueError("revoking certificates by serial needs the CA that signed them")
        section = _string(_key_blob(ca_public)) + _string(b"")
        section += bytes([CERT_SERIAL_LIST]) + _string(
            b"".join(struct.pack(">Q", s) for s in serials)
        )
        body += bytes([SECTION_CERTIFICATES]) + _string(section)
    hashes = sorted({hashlib.sha256(_key_blob(line)).digest() for line in keys})
    if hashes:
        body += bytes([SECTION_FINGERPRINT_SHA256]) + _string(b"".join(_string(h) for h in hashes))
    return body
