"""OpenSSH certificates for the SSH mesh: the cluster's CA signs each node's host key and each
mesh user's key, so every node trusts one CA line instead of N keys.

Plain functions over OpenSSH public-key lines (``type base64 [comment]``) and the CA's private
key; certificates are made with ``cryptography`` (``SSHCertificateBuilder``) and read back
with it. No host is touched here.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    SSHCertificate,
    SSHCertificateBuilder,
    SSHCertificateType,
)

# What a user certificate permits: what `ssh-keygen -s` grants by default, so mesh logins
# (pdsh, mpirun, torchrun's launchers) keep their pty, agent and port forwarding.
USER_EXTENSIONS = (
    b"permit-X11-forwarding",
    b"permit-agent-forwarding",
    b"permit-port-forwarding",
    b"permit-pty",
    b"permit-user-rc",
)
FOREVER = 253402300799  # 9999-12-31: what a certificate valid "forever" (2**64-1) reads as
BACKDATE = timedelta(minutes=5)  # valid from a little before now: nodes' clocks differ


class CertificateError(ValueError):
    """A key or certificate line that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class CertificateInfo:
    """What a certificate says, read back from its line."""

    kind: str  # host | user
    key_id: str
    serial: int
    principals: tuple[str, ...]
    valid_after: datetime
    valid_before: datetime
    ca_fingerprint: str  # SHA256:... of the signing CA's public key, as ssh-keygen -l prints it
    key: str  # the certified public key, ``type base64``
    signed: bool = True  # its signature verifies with the CA key it names (False: damaged, forged)

    def time_left(self, now: datetime) -> timedelta:
        return self.valid_before - now


def fingerprint(public_line: str) -> str:
    """``SHA256:...`` of a public key line, as ``ssh-keygen -l`` prints it."""
    blob = _blob(public_line)
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def sign(
    ca: Ed25519PrivateKey,
    public_line: str,
    kind: str,
    principals: list[str],
    key_id: str,
    serial: int,
    validity: timedelta,
    now: datetime | None = None,
) -> str:
    """A certificate line (``type-cert-v01@openssh.com base64 key_id``) for ``public_line``,
    signed by ``ca``: a host certificate (``kind`` host) or a user certificate (``user``),
    valid for ``principals`` from a little before ``now`` for ``validity``."""
    if kind not in ("host", "user"):
        raise CertificateError(f"a certificate is for a host or a user, not {kind!r}")
    if not principals:
        raise CertificateError(f"{key_id}: a certificate needs at least one principal")
    try:
        key = serialization.load_ssh_public_key(" ".join(public_line.split()[:2]).encode())
    except (ValueError, TypeError, IndexError, UnsupportedAlgorithm) as exc:
        raise CertificateError(f"{key_id}: not an OpenSSH public key ({exc})") from None
    now = now or datetime.now(UTC)
    builder = (
        SSHCertificateBuilder()
        .public_key(key)  # type: ignore[arg-type]
        .serial(serial)
        .type(SSHCertificateType.HOST if kind == "host" else SSHCertificateType.USER)
        .key_id(key_id.encode())
        .valid_principals([p.encode() for p in principals])
        .valid_after(int((now - BACKDATE).timestamp()))
        .valid_before(int((now + validity).timestamp()))
    )
    if kind == "user":
        for extension in USER_EXTENSIONS:
            builder = builder.add_extension(extension, b"")
    certificate = builder.sign(ca)
    return f"{certificate.public_bytes().decode()} {key_id}"


def read(line: str) -> CertificateInfo:
    """What a certificate line says; CertificateError if it is not one. The line may come from
    a file a node user controls: whatever it holds ends as CertificateError, never another
    exception. ``signed`` says whether its signature verifies with the CA key it names;
    whether that CA is the cluster's is ``problem``'s to check."""
    try:
        return _read(line)
    except CertificateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any field a forger chose (times out of range, ...)
        raise CertificateError(
            f"not a usable OpenSSH certificate ({type(exc).__name__}: {exc})"
        ) from None


def _when(seconds: int) -> datetime:
    return datetime.fromtimestamp(max(0, min(seconds, FOREVER)), UTC)


def _read(line: str) -> CertificateInfo:
    try:
        certificate = serialization.load_ssh_public_identity(" ".join(line.split()[:2]).encode())
    except (ValueError, TypeError, IndexError, UnsupportedAlgorithm) as exc:
        raise CertificateError(f"not an OpenSSH certificate ({exc})") from None
    if not isinstance(certificate, SSHCertificate):
        raise CertificateError("a plain public key, not a certificate")
    ca_line = (
        certificate.signature_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    key_line = (
        certificate.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return CertificateInfo(
        kind="host" if certificate.type == SSHCertificateType.HOST else "user",
        key_id=certificate.key_id.decode(errors="replace"),
        serial=certificate.serial,
        principals=tuple(p.decode(errors="replace") for p in certificate.valid_principals),
        valid_after=_when(certificate.valid_after),
        valid_before=_when(certificate.valid_before),
        ca_fingerprint=fingerprint(ca_line),
        key=" ".join(key_line.split()[:2]),
        signed=_verifies(certificate),
    )


def _verifies(certificate: SSHCertificate) -> bool:
    try:
        certificate.verify_cert_signature()
    except InvalidSignature:
        return False
    return True


def problem(
    line: str | None,
    ca_public: str | None,
    kind: str,
    principals: list[str],
    now: datetime | None = None,
) -> str | None:
    """Why ``line`` is not a certificate the CA ``ca_public`` signed (None: any CA whose
    signature verifies), of this ``kind`` (host | user), for exactly these ``principals`` and
    valid ``now`` (None: it is)."""
    if not line:
        return "no certificate"
    try:
        info = read(line)
    except CertificateError as exc:
        return str(exc)
    now = now or datetime.now(UTC)
    if not info.signed:
        return "its signature does not verify (damaged or forged)"
    if ca_public is not None and info.ca_fingerprint != fingerprint(ca_public):
        return "signed by another CA"
    if info.kind != kind:
        return f"a {info.kind} certificate where a {kind} certificate is wanted"
    if set(info.principals) != set(principals):
        return f"principals {','.join(info.principals)}, the plan wants {','.join(principals)}"
    if info.valid_after > now:
        return f"not valid before {info.valid_after:%Y-%m-%d %H:%M} UTC"
    if info.valid_before <= now:
        return f"expired {info.valid_before:%Y-%m-%d %H:%M} UTC"
    return None


def needs_renewal(
    line: str | None,
    public_line: str,
    ca_public: str,
    principals: list[str],
    renew_before: timedelta,
    now: datetime | None = None,
    kind: str = "host",
) -> str | None:
    """Why the certificate ``line`` must be signed again (None: it is fine): not a valid
    ``kind`` certificate of the CA for these principals (``problem``), for another key, or
    expiring within ``renew_before``."""
    now = now or datetime.now(UTC)
    why = problem(line, ca_public, kind, principals, now)
    if why:
        return why
    info = read(line or "")
    if info.key != " ".join(public_line.split()[:2]):
        return "certifies another key"
    if info.time_left(now) < renew_before:
        return f"expires {info.valid_before:%Y-%m-%d %H:%M} UTC"
    return None


def _blob(public_line: str) -> bytes:
    try:
        return base64.b64decode(public_line.split()[1], validate=True)
    except (IndexError, ValueError) as exc:
        raise CertificateError(f"not an OpenSSH public key line ({exc})") from None
