"""Key revocation lists written by trainfleet, judged by OpenSSH's own ssh-keygen -Q: a
revoked certificate serial and a revoked key are refused, everything else passes."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.unit.test_certificates import public_line
from trainfleet.certificates import sign
from trainfleet.krl import build

pytestmark = pytest.mark.skipif(
    shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen"
)


def revoked(krl: Path, line: str, tmp_path: Path) -> bool:
    key = tmp_path / "query.pub"
    key.write_text(line + "\n")
    result = subprocess.run(
        ["ssh-keygen", "-Q", "-f", str(krl), str(key)], capture_output=True, text=True
    )
    assert result.returncode in (0, 1), result.stderr  # 2 and up: ssh-keygen could not read the KRL
    assert ("REVOKED" in result.stdout) == (result.returncode == 1), result.stdout
    return result.returncode == 1


def test_openssh_refuses_exactly_the_revoked_serials_and_keys(tmp_path):
    ca, other_ca = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = [public_line(Ed25519PrivateKey.generate()) for _ in range(4)]
    certs = [
        sign(ca, key, "user", ["root"], f"node{i}", serial=i + 1, validity=timedelta(days=1))
        for i, key in enumerate(keys)
    ]
    krl = tmp_path / "revoked.krl"
    krl.write_bytes(
        build(public_line(ca), serials=[2], keys=[keys[3]], version=1, generated=1_790_000_000)
    )

    assert [revoked(krl, cert, tmp_path) for cert in certs] == [
        False,
        True,
        False,
        True,
    ]  # serial 2; key 4's cert
    assert [revoked(krl, key, tmp_path) for key in keys] == [False, False, False, True]
    # the same serial under another CA is another certificate
    assert not revoked(
        krl,
        sign(other_ca, keys[0], "user", ["root"], "x", serial=2, validity=timedelta(days=1)),
        tmp_path,
    )


def test_an_empty_krl_revokes_nothing_and_its_size_does_not_grow_with_the_cluster(tmp_path):
    ca = Ed25519PrivateKey.generate()
    empty = tmp_path / "empty.krl"
    empty.write_bytes(build(public_line(ca), serials=[], keys=[], version=1, generated=0))
    assert not revoked(empty, public_line(Ed25519PrivateKey.generate()), tmp_path)
    one = build(public_line(ca), serials=[9], keys=[], version=2, generated=0)
    assert (
        len(one)
        == len(build(public_line(ca), serials=[9, 9], keys=[], version=2, generated=0))
        < 200
    )


def test_bad_input_is_refused_before_any_file_is_written():
    with pytest.raises(ValueError, match="serials"):
        build(None, serials=[0], keys=[], version=1, generated=0)
    with pytest.raises(ValueError, match="needs the CA"):
        build(None, serials=[3], keys=[], version=1, generated=0)
    with pytest.raises(ValueError, match="not an OpenSSH public key"):
        build(None, serials=[], keys=["ssh-ed25519"], version=1, generated=0)
