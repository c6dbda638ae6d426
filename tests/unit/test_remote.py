"""The remote file-changing scripts, run for real (sh, awk, mktemp) against local temp files."""

from __future__ import annotations

import os
import stat
import subprocess

from operations.remote import fail_command, replace_block_command, write_file_command
from trainfleet.blocks import markers

BEGIN, END = markers("test block")


def run(command) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)


def test_a_block_is_appended_and_user_lines_are_kept_byte_for_byte(tmp_path):
    target = tmp_path / "hosts"
    user = "127.0.0.1 localhost\n# a comment with 'quotes' and $dollars\n\n10.0.0.1 nas\n"
    target.write_text(user)
    os.chmod(target, 0o640)

    assert run(replace_block_command(str(target), BEGIN, END, ["a b", "c $HOME `x`"])).returncode == 0

    assert target.read_text() == user + f"{BEGIN}\na b\nc $HOME `x`\n{END}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["hosts"], "no temp file left behind"


def test_a_block_is_replaced_where_it_stands_and_can_be_removed(tmp_path):
    target = tmp_path / "f"
    target.write_text(f"top\n{BEGIN}\nold\n{END}\nbottom\n")

    run(replace_block_command(str(target), BEGIN, END, ["new 1", "new 2"]))
    assert target.read_text() == f"top\n{BEGIN}\nnew 1\nnew 2\n{END}\nbottom\n"

    run(replace_block_command(str(target), BEGIN, END, [], present=False))
    assert target.read_text() == "top\nbottom\n"


def test_a_missing_file_and_its_directory_are_created_with_the_given_mode(tmp_path):
    target = tmp_path / "new" / "dir" / "authorized_keys"
    assert run(replace_block_command(str(target), BEGIN, END, ["k"], mode="600")).returncode == 0
    assert target.read_text() == f"{BEGIN}\nk\n{END}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_write_file_is_atomic_and_keeps_an_existing_mode(tmp_path):
    target = tmp_path / "hostname"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    assert run(write_file_command(str(target), "gpu-a01\n", mode="644")).returncode == 0
    assert target.read_text() == "gpu-a01\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_fail_command_fails_with_its_message():
    result = run(fail_command("it's broken"))
    assert result.returncode == 1
    assert result.stderr == "trainfleet: it's broken\n"
