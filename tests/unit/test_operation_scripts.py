"""The operations' scripts live in operations/scripts/: each file is used, and the commands the
operations build are byte for byte the ones they built while the scripts were Python strings
(digests taken before the move; a deliberate script change updates its digest here)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from unittest import mock

import pytest
from pyinfra.api import FileUploadCommand
from pyinfra.api.command import PyinfraCommand

from operations.remote import (
    SCRIPTS,
    as_user_command,
    run_dir_command,
    write_command,
    write_file_command,
)
from operations.shm_ops import remove_command
from operations.ssh_mesh_ops import reload_sshd_command
from operations.stack_repo_ops import keyring_install

SHA = "0" * 64
SEGMENT = {"shmid": 5, "key": "0x0", "bytes": 1, "owner_uid": 0, "creator_pid": 1, "last_pid": 1}
KEYRING = "https://m.example.com/ubuntu2204/x86_64/cuda-keyring_1.1-1_all.deb"

COMMANDS = {
    # as root (a link met is followed on the node, by the same script)
    "175743fc90420d80fd72675f7858299e136e9cb3b4ff0b96b709adc7dc38cee7": lambda: write_command(
        "/etc/hosts", "127.0.0.1 localhost\n"
    ),
    # as the user, compare and swap
    "f812208fe7e0534f1608f4320187880c941e0e8f5e363adeebad2b8d7c9b005b": lambda: write_command(
        "/home/alice/.ssh/config", b"Host *\n", expect=SHA, mode="600", user="alice", dir_mode="700"
    ),
    "7f71d18b73a498e7fbb40c1e5abe773973a32546099b07057083af5146627371": lambda: write_file_command(
        "/etc/profile.d/x.sh", "export A=1\n"
    ),
    # uploaded: the run dir, the upload, the writer reading it
    "c6b4537d8e801f4591875e8436a02b5d9e0159cba4a5d3aec2ee33fd48acc34e": lambda: write_command(
        "/root/.ssh/id", "KEY\n", expect="absent", mode="600", secret=True
    ),
    "5fb0bdb2d7dd2759a6500c0973e714688e22c1fe9c55a1c4a1e5454e094272e9": run_dir_command,
    "26e912b8a97edc8a06342dd7326e3a7bb41cd2f50827e04a0699e770f90389cc": lambda: run_dir_command(
        "alice"
    ),
    "ebbca9c11246c9bd9401ecb7589670dc52378c206afb30bc00abe791f4b5a59e": lambda: as_user_command(
        "alice", 'chmod 700 -- "$1"', "/home/alice/.ssh"
    ),
    "19a4e19103f2c0145d2bee3b128bfebbc148d52f4ce39a7cffef1051e3bc9e28": reload_sshd_command,
    "48c2e3c7bc151d7b9cd9cca6e69ef39f798b2944c4ce891886300817a09bc894": lambda: keyring_install(
        KEYRING, "EB693B3035CD5710E231E123A4B469963BF863CC"
    ),
    "a5105d43dfddfa584b12636919d018c5f39285221f7ca77bf1e61a4b50117cd1": lambda: remove_command(
        [{**SEGMENT, "idle_seconds": 99}, {**SEGMENT, "shmid": 7, "idle_seconds": 99}]
    ),
}


def text(command: PyinfraCommand) -> str:
    if isinstance(command, FileUploadCommand):
        return f"upload {command.src.getvalue()!r} {command.dest} {command.remote_temp_filename}"
    return command.get_raw_value()


@pytest.mark.parametrize("digest", COMMANDS)
def test_an_operations_command_is_the_one_it_built_before_its_script_became_a_file(digest):
    with mock.patch("operations.remote.uuid.uuid4", return_value=uuid.UUID(int=1)):
        built = COMMANDS[digest]()
    commands = built if isinstance(built, list) else [built]
    assert hashlib.sha256("\n".join(map(text, commands)).encode()).hexdigest() == digest


def test_every_script_in_operations_scripts_is_read_by_an_operation():
    sources = "".join(p.read_text() for p in Path(SCRIPTS.parent).glob("*.py"))
    unused = [p.name for p in SCRIPTS.iterdir() if f'script("{p.name}")' not in sources]
    assert unused == []
