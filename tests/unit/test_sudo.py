"""The passwordless-sudo proof (facts/sudo.py), run by a real shell against stand-in sudo
commands on PATH: what sudo prints decides, never a guess."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from facts.sudo import PROBE, sudo_refusal


def probe_with(tmp_path: Path, sudo_script: str | None) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "printf", "tail", "tr", "cut", "id"):  # the probe's own tools, and nothing else
        os.symlink(subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
                   or f"/usr/bin/{tool}", bin_dir / tool)
    if sudo_script is not None:
        sudo = bin_dir / "sudo"
        sudo.write_text("#!/bin/sh\n" + sudo_script)
        sudo.chmod(0o755)
    result = subprocess.run([str(bin_dir / "sh"), "-c", PROBE], capture_output=True, text=True,
                            env={"PATH": str(bin_dir)}, timeout=10)
    assert result.returncode == 0 and result.stderr == ""  # one line on stdout, whatever happened
    return result.stdout.splitlines()


def test_a_warning_before_root_still_proves_sudo(tmp_path):
    lines = probe_with(tmp_path, "echo 'sudo: unable to resolve host ip-10-0-0-1: Name or service not known' >&2\necho 0\n")
    assert sudo_refusal(lines, "admin") is None


@pytest.mark.parametrize("script, said", [
    ("echo 'sudo: a password is required' >&2\nexit 1\n", "sudo: a password is required"),
    ("echo 'sudo-rs: interactive authentication is required' >&2\nexit 1\n", "sudo-rs: interactive authentication"),
    ("echo 1000\n", "1000"),  # ran, but not as root (a sudoers rule for another user)
    ("echo 0\nexit 1\n", "0"),  # said 0 but failed
    (None, "sudo: not found"),
])
def test_sudo_that_cannot_act_as_root_without_a_password_is_refused_with_what_it_said(tmp_path, script, said):
    lines = probe_with(tmp_path, script)
    refusal = sudo_refusal(lines, "admin")
    assert refusal is not None and refusal.startswith("admin cannot act as root without a password")
    assert said in refusal


def test_no_answer_or_a_forged_ok_among_other_lines_is_a_refusal():
    assert sudo_refusal([], "admin") is not None
    assert sudo_refusal(["trainfleet-sudo: ok", "trainfleet-sudo: refused: x"], "admin") is not None


def test_what_sudo_said_is_escaped_before_it_is_printed():
    refusal = sudo_refusal(["trainfleet-sudo: refused: \x1b[2Jgone"], "admin")
    assert "\x1b" not in refusal and "\\x1b[2Jgone" in refusal
