"""The facts' scripts live in facts/scripts/: each file is used, and the commands the facts
build are byte for byte the ones they built while the scripts were Python strings (digests
taken before the move; a deliberate script change updates its digest here)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from facts.gpu_node_facts import GpuNodeState
from facts.launchers_facts import LauncherContents, LauncherFiles
from facts.nccl_env_facts import NcclEnvFiles, NcclEnvSeen, NcclNetwork
from facts.npu_facts import NpuDeviceIps
from facts.openmpi_facts import OpenMpiState
from facts.shell import SCRIPTS
from facts.ssh_mesh_facts import SshdMesh, SshMeshProof, SshMeshUser
from facts.stack_facts import StackVersions

COMMANDS = {
    # #40: the GPUDirect RDMA path's two reads (the NVIDIA version line, the kernel release)
    "5306d765c04f09f440913d648bdafd9a25facf77d73bfeb1b0955e1655d09697": GpuNodeState().command,
    "a1c69e5a21a59ecb956b010e397b73900ffa624d2e249cdebd6667ca32666673": lambda: (
        OpenMpiState().command(["root", "alice"])
    ),
    "492fba6bdd34916e859d320b42b57597ed4c49e382309c8a0bdcf3c7eaa76b03": lambda: (
        LauncherFiles().command("/etc/trainfleet/launch")
    ),
    "3f5adab53eaa5292409a96c933053aca86f831e8cc7cf0cf32726615ae05c3ca": lambda: (
        LauncherContents().command("/d", ["a.sh", "b c"])
    ),
    "1e08ef79ebbab926d25c080e2cd8352cb71ea943921bce0a4b4cdab8ce4bbc48": lambda: (
        StackVersions().command("/opt/venv")
    ),
    "94351fae03ec714685c6ccd38ef24f3b53e687196752b9e917db72859d94bf30": NpuDeviceIps().command,
    "ae658b8070a74b14cb9aab76ec5b7448b72b4c7b75e363953b559e4d8d2f25c9": lambda: (
        SshMeshUser().command("alice")
    ),
    "063bb315a8b186f9e94949e0cf3a9fdc6b6092fb46a8a02c637d77b4d6227157": SshdMesh().command,
    "c0d9af3772782a2f57559978d94375fa8821f6dada3c031dd96eb200362b3713": lambda: (
        SshMeshProof().command("root", ["a", "b"])
    ),
    "d7c0446ec3348c89793a441f3b5e2759fa8a0909c00be66bdcfbab8ed8159026": NcclNetwork().command,
    "9f646316c0d5f094c5c2c0d684952f790a993a97f975c3a00ef6f8d3e60cf791": NcclEnvFiles().command,
    "fbdfd6c3ea83c028ee6b1f0be4e239173f078119009f1705f6f6470d7238f490": NcclEnvSeen().command,
}


@pytest.mark.parametrize("digest", COMMANDS)
def test_a_facts_command_is_the_one_it_built_before_its_script_became_a_file(digest):
    command = COMMANDS[digest]()
    text = command if isinstance(command, str) else command.get_raw_value()
    assert hashlib.sha256(text.encode()).hexdigest() == digest


def test_every_script_in_facts_scripts_is_read_by_a_fact():
    sources = "".join(p.read_text() for p in Path(SCRIPTS.parent).glob("*_facts.py"))
    unused = [p.name for p in SCRIPTS.iterdir() if f'script("{p.name}")' not in sources]
    assert unused == []
