"""The sshd reload of the certificate mesh (operations/ssh_mesh_ops.py ``_RELOAD_SSHD``), run for
real with stand-ins for sshd, ssh-keygen and systemctl: sshd is reloaded only when what it
will read is proven, and a drop-in is moved aside only when it is the reason it is not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from operations.ssh_mesh_ops import _RELOAD_SSHD

# sshd -t fails when the file named by $BAD_IF_PRESENT exists, or always with $SSHD_BROKEN.
FAKE_SSHD = """#!/bin/sh
[ "$1" = -t ] || exit 2
[ -n "$SSHD_BROKEN" ] && {
  echo "sshd_config line 3: Bad configuration option: Nonsense" >&2; exit 255
}
[ -n "$BAD_IF_PRESENT" ] && [ -e "$BAD_IF_PRESENT" ] && { echo "bad drop-in" >&2; exit 255; }
exit 0
"""
# ssh-keygen -Q exits 255 on a KRL that does not parse (here: one holding "corrupt").
FAKE_KEYGEN = """#!/bin/sh
grep -q corrupt "$3" && exit 255
exit 0
"""
FAKE_SYSTEMCTL = """#!/bin/sh
case "$1" in
  is-active) [ "$3" = ssh ] && exit 0; exit 3 ;;
  reload) echo "reloaded $2" >> "$RELOADS" ;;
esac
"""


@pytest.fixture
def node(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (
        ("sshd", FAKE_SSHD),
        ("ssh-keygen", FAKE_KEYGEN),
        ("systemctl", FAKE_SYSTEMCTL),
    ):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "krl").write_bytes(b"SSHKRL\n\0good")
    (tmp_path / "mesh.conf").write_text("RevokedKeys krl\n")
    (tmp_path / "client.conf").write_text("Host *\n    RevokedHostKeys krl\n")
    return tmp_path


def reload(node: Path, **env: str) -> tuple[int, str, list[str]]:
    """Run the reload script on ``node``: (exit status, stderr, sshd reloads)."""
    reloads = node / "reloads"
    proc = subprocess.run(
        [
            "sh",
            "-c",
            _RELOAD_SSHD,
            "trainfleet",
            str(node / "krl"),
            str(node / "mesh.conf"),
            str(node / "client.conf"),
        ],
        env={
            **os.environ,
            "PATH": f"{node / 'bin'}:{os.environ['PATH']}",
            "RELOADS": str(reloads),
            **env,
        },
        capture_output=True,
        text=True,
    )
    return (
        proc.returncode,
        proc.stderr,
        reloads.read_text().splitlines() if reloads.exists() else [],
    )


def test_a_good_krl_and_configuration_reload_sshd_once(node):
    assert reload(node) == (0, "", ["reloaded ssh"])
    assert (node / "mesh.conf").exists()


def test_a_krl_that_does_not_parse_takes_the_drop_in_away_and_reloads_sshd_without_it(node):
    (node / "krl").write_bytes(b"corrupt")
    status, err, reloads = reload(node)
    assert status == 1 and "does not read as a key revocation list" in err
    assert not (node / "mesh.conf").exists() and (node / "mesh.conf.rejected").exists()
    assert reloads == ["reloaded ssh"]  # sshd no longer names the bad KRL: every key is not refused
    # Nor does ssh (which would refuse every host while its RevokedHostKeys file does not read).
    assert not (node / "client.conf").exists() and (node / "client.conf.rejected").exists()


def test_a_drop_in_sshd_refuses_is_moved_aside_and_sshd_is_not_reloaded(node):
    status, err, reloads = reload(node, BAD_IF_PRESENT=str(node / "mesh.conf"))
    assert status == 1 and "refused trainfleet's drop-in (bad drop-in)" in err
    assert (node / "mesh.conf.rejected").exists() and not (node / "mesh.conf").exists()
    assert reloads == []


def test_sshd_broken_without_the_drop_in_too_keeps_the_drop_in_and_names_sshds_own_problem(node):
    status, err, reloads = reload(node, SSHD_BROKEN="1")
    assert status == 1 and "with or without trainfleet's drop-in" in err and "Nonsense" in err
    assert (node / "mesh.conf").exists() and not (node / "mesh.conf.rejected").exists()
    assert reloads == []
