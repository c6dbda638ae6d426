"""The remote file-changing scripts, run for real (sh, awk, mktemp) against local temp files."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from pyinfra.api import FileUploadCommand

from operations.remote import INLINE_LIMIT, fail_command, replace_block_command, write_file_command
from trainfleet.blocks import markers

BEGIN, END = markers("test block")


def run(commands) -> subprocess.CompletedProcess[str]:
    """Run the commands here as pyinfra would on a node; an upload is a local file copy."""
    result = None
    for command in commands if isinstance(commands, list) else [commands]:
        if isinstance(command, FileUploadCommand):
            command.src.seek(0)
            Path(command.dest).write_text(command.src.read())
            continue
        result = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)
        if result.returncode:
            return result
    return result


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


def test_with_top_a_new_block_goes_first_and_an_existing_one_stays_once(tmp_path):
    target = tmp_path / "config"
    target.write_text("Host *\n    User alice\n")
    run(replace_block_command(str(target), BEGIN, END, ["Host n1", "    User root"], top=True))
    assert target.read_text() == f"{BEGIN}\nHost n1\n    User root\n{END}\nHost *\n    User alice\n"
    run(replace_block_command(str(target), BEGIN, END, ["Host n2"], top=True))
    assert target.read_text() == f"{BEGIN}\nHost n2\n{END}\nHost *\n    User alice\n"


def test_a_block_too_large_for_one_argument_is_uploaded_and_the_staged_file_removed(tmp_path):
    target = tmp_path / "ssh_known_hosts"
    target.write_text("user line\n")
    lines = [f"node{i},10.0.{i // 250}.{i % 250} ssh-ed25519 {'A' * 68}" for i in range(1200)]
    commands = replace_block_command(str(target), BEGIN, END, lines)
    assert sum(len(line) + 1 for line in lines) > INLINE_LIMIT
    assert isinstance(commands[0], FileUploadCommand) and len(commands[1].get_raw_value()) < INLINE_LIMIT

    assert run(commands).returncode == 0

    assert target.read_text() == "user line\n" + "".join(f"{line}\n" for line in [BEGIN, *lines, END])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ssh_known_hosts"]
