"""Certificates made for the SSH mesh, read back by OpenSSH's own ssh-keygen (-L), and the
renewal rule (missing, other key, other CA, other principals, expiring)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainfleet.certificates import (
    CertificateError,
    fingerprint,
    needs_renewal,
    problem,
    read,
    sign,
)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def public_line(key: Ed25519PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


@pytest.fixture()
def ca() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture()
def host_key() -> str:
    return public_line(Ed25519PrivateKey.generate())


def test_a_host_certificate_says_what_it_was_signed_for(ca, host_key):
    line = sign(
        ca,
        host_key,
        "host",
        ["gpu-a01", "gpu-a01.cluster.example.com", "192.0.2.11"],
        "trainfleet:prod:host@gpu-a01",
        7,
        30 * DAY,
        now=NOW,
    )
    info = read(line)
    assert line.startswith("ssh-ed25519-cert-v01@openssh.com ") and line.endswith(
        " trainfleet:prod:host@gpu-a01"
    )
    assert (info.kind, info.serial, info.key) == ("host", 7, host_key)
    assert info.principals == ("gpu-a01", "gpu-a01.cluster.example.com", "192.0.2.11")
    assert info.valid_after == NOW - timedelta(minutes=5) and info.valid_before == NOW + 30 * DAY
    assert info.ca_fingerprint == fingerprint(public_line(ca))


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_openssh_reads_a_user_certificate_as_it_was_signed(ca, host_key, tmp_path):
    cert = tmp_path / "id-cert.pub"
    cert.write_text(
        sign(ca, host_key, "user", ["root"], "trainfleet:prod:root@gpu-a01", 3, DAY, now=NOW) + "\n"
    )
    shown = subprocess.run(
        ["ssh-keygen", "-L", "-f", str(cert)], capture_output=True, text=True, check=True
    ).stdout
    assert "Type: ssh-ed25519-cert-v01@openssh.com user certificate" in shown
    assert f"Signing CA: ED25519 {fingerprint(public_line(ca))}" in shown
    assert 'Key ID: "trainfleet:prod:root@gpu-a01"' in shown and "Serial: 3" in shown
    assert "Principals: \n                root\n" in shown
    assert "permit-pty" in shown and "permit-port-forwarding" in shown
    ca_pub = tmp_path / "ca.pub"
    ca_pub.write_text(public_line(ca) + "\n")
    # ssh-keygen -l on the certificate names the certified key's fingerprint
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(cert)], capture_output=True, text=True, check=True
    ).stdout
    assert fingerprint(host_key) in listed


def test_a_certificate_is_renewed_when_missing_for_another_key_or_ca_other_principals_or_expiring(
    ca, host_key
):
    ca_pub = public_line(ca)
    line = sign(ca, host_key, "host", ["gpu-a01"], "k", 1, 30 * DAY, now=NOW)
    assert needs_renewal(line, host_key, ca_pub, ["gpu-a01"], 7 * DAY, now=NOW) is None
    assert needs_renewal(None, host_key, ca_pub, ["gpu-a01"], 7 * DAY, now=NOW) == "no certificate"
    assert (
        needs_renewal(
            line, public_line(Ed25519PrivateKey.generate()), ca_pub, ["gpu-a01"], 7 * DAY, now=NOW
        )
        == "certifies another key"
    )
    assert (
        needs_renewal(
            line, host_key, public_line(Ed25519PrivateKey.generate()), ["gpu-a01"], 7 * DAY, now=NOW
        )
        == "signed by another CA"
    )
    assert needs_renewal(
        line, host_key, ca_pub, ["gpu-a01", "gpu-a01.c"], 7 * DAY, now=NOW
    ).startswith("principals")
    assert needs_renewal(
        line, host_key, ca_pub, ["gpu-a01"], 7 * DAY, now=NOW + 24 * DAY
    ).startswith("expires")
    assert needs_renewal(
        "ssh-ed25519 AAAA garbage", host_key, ca_pub, ["gpu-a01"], 7 * DAY, now=NOW
    )


@pytest.mark.parametrize("line", ["", "ssh-ed25519", "ssh-ed25519 !!!", "not a key at all"])
def test_what_is_not_a_key_is_refused_with_a_reason(ca, line):
    with pytest.raises(CertificateError):
        sign(ca, line, "host", ["a"], "k", 1, DAY)
    with pytest.raises(CertificateError):
        read(line)


def test_a_plain_key_is_not_a_certificate_and_a_certificate_needs_principals(ca, host_key):
    with pytest.raises(CertificateError, match="plain public key"):
        read(host_key)
    with pytest.raises(CertificateError, match="principal"):
        sign(ca, host_key, "host", [], "k", 1, DAY)
    with pytest.raises(CertificateError, match="host or a user"):
        sign(ca, host_key, "admin", ["a"], "k", 1, DAY)


# -- verification (issue #26): signature, CA, type, principals, validity window -----------------

needs_ssh_keygen = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen"
)
NAMES = ["gpu-a01", "gpu-a01.cluster.example.com", "192.0.2.11"]


def private_file(key: Ed25519PrivateKey, path) -> str:
    """``key`` as an OpenSSH private key file (0600) that ``ssh-keygen -s`` signs with."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return str(path)


def keygen_sign(ca: Ed25519PrivateKey, key: str, tmp_path, *options: str) -> str:
    """A certificate of ``key`` made by OpenSSH's own ``ssh-keygen -s`` with ``ca``."""
    pub = tmp_path / "key.pub"
    pub.write_text(key + "\n")
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-s",
            private_file(ca, tmp_path / "ca"),
            "-I",
            "site",
            "-z",
            "9",
            *options,
            str(pub),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "TZ": "UTC"},
    )
    return (tmp_path / "key-cert.pub").read_text().strip()


def flipped(line: str, at: int = -10) -> str:
    """``line`` with one byte of its blob flipped (``at`` from the end: inside the signature)."""
    kind, blob = line.split()[:2]
    data = bytearray(base64.b64decode(blob))
    data[at] ^= 0x01
    return f"{kind} {base64.b64encode(bytes(data)).decode()}"


@needs_ssh_keygen
def test_a_certificate_openssh_signed_with_the_clusters_ca_is_the_clusters(ca, host_key, tmp_path):
    line = keygen_sign(
        ca, host_key, tmp_path, "-h", "-n", ",".join(NAMES), "-V", "20261101:20271101"
    )
    assert read(line).signed
    assert problem(line, public_line(ca), "host", NAMES, NOW) is None
    assert needs_renewal(line, host_key, public_line(ca), NAMES, 7 * DAY, NOW, "host") is None


@needs_ssh_keygen
@pytest.mark.parametrize(
    "options, wanted, why",
    [
        (
            ("-h", "-n", ",".join(NAMES), "-V", "20261101:20271101"),
            "user",
            "a host certificate where a user",
        ),
        (
            ("-n", ",".join(NAMES), "-V", "20261101:20271101"),
            "host",
            "a user certificate where a host",
        ),
        (
            ("-h", "-n", "gpu-a01", "-V", "20261101:20271101"),
            "host",
            "principals gpu-a01, the plan wants",
        ),
        (("-h", "-n", ",".join(NAMES), "-V", "20250101:20260101"), "host", "expired 2026-01-01"),
        (
            ("-h", "-n", ",".join(NAMES), "-V", "20270101:20280101"),
            "host",
            "not valid before 2027-01-01",
        ),
    ],
)
def test_an_openssh_made_certificate_of_the_wrong_type_principals_or_window_is_not_the_clusters(
    ca, host_key, tmp_path, options, wanted, why
):
    line = keygen_sign(ca, host_key, tmp_path, *options)
    assert problem(line, public_line(ca), wanted, NAMES, NOW).startswith(why)
    assert needs_renewal(line, host_key, public_line(ca), NAMES, 7 * DAY, NOW, wanted).startswith(
        why
    )


@needs_ssh_keygen
def test_a_certificate_signed_by_another_ca_is_not_the_clusters_even_with_everything_else_right(
    ca, host_key, tmp_path
):
    other = Ed25519PrivateKey.generate()
    line = keygen_sign(
        other, host_key, tmp_path, "-h", "-n", ",".join(NAMES), "-V", "20261101:20271101"
    )
    assert read(line).signed  # a good signature, of the wrong CA
    assert problem(line, public_line(ca), "host", NAMES, NOW) == "signed by another CA"


@needs_ssh_keygen
@pytest.mark.parametrize("made_by", ["trainfleet", "ssh-keygen"])
def test_a_byte_flipped_signature_is_named_though_the_certificate_still_reads(
    ca, host_key, tmp_path, made_by
):
    good = (
        sign(ca, host_key, "host", NAMES, "k", 1, 30 * DAY, now=NOW)
        if made_by == "trainfleet"
        else keygen_sign(
            ca, host_key, tmp_path, "-h", "-n", ",".join(NAMES), "-V", "20261101:20271101"
        )
    )
    damaged = flipped(good)
    info = read(damaged)  # every field still reads as before...
    assert (info.principals, info.ca_fingerprint, info.signed) == (
        tuple(NAMES),
        fingerprint(public_line(ca)),
        False,
    )
    why = "its signature does not verify (damaged or forged)"
    assert problem(damaged, public_line(ca), "host", NAMES, NOW) == why
    assert needs_renewal(damaged, host_key, public_line(ca), NAMES, 7 * DAY, NOW, "host") == why
    # ...and a principal edited in the blob (a forger moving the certificate to another name) too.
    kind, blob = good.split()[:2]
    moved = (
        f"{kind} "
        f"{base64.b64encode(base64.b64decode(blob).replace(b'gpu-a01', b'gpu-a02')).decode()}"
    )
    assert read(moved).principals[0] == "gpu-a02" and not read(moved).signed
    assert (
        problem(moved, public_line(ca), "host", [n.replace("a01", "a02") for n in NAMES], NOW)
        == why
    )
