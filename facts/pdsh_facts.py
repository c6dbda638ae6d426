"""Facts of pdsh: the OS family it is installed for, and its configuration files."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.managed_block_facts import FILE_FN, BlockState, block_state, file_text, read_file_lines
from facts.os_release_facts import OS_FAMILY_SH
from trainfleet.defaults import PDSH_GENDERS, PDSH_MACHINES, PDSH_PROFILE, PDSH_RCMD_DEFAULT
from trainfleet.osfamily import OsFamilyT, os_release

PDSH_PURPOSE = "pdsh nodes"

_SCRIPT = (
    FILE_FN
    + "\n"
    + OS_FAMILY_SH
    + r"""
echo "pdsh $(command -v pdsh || echo missing)"
for f in "$@"; do tf_file "$f" "$f"; done
"""
)


class PdshStateT(TypedDict):
    os: OsFamilyT
    installed: bool
    rcmd_default: str | None
    profile: str | None
    genders: BlockState
    machines: BlockState


class PdshState(FactBase[PdshStateT]):
    """
    pdsh on the node, in one command: OS family, whether pdsh is installed, the
    default remote command type, and the managed blocks of the files ``pdsh -a`` reads.

    .. code:: python

        {
            "os": {"id": "debian", "family": "debian", "version": "12", "package_manager": "apt"},
            "installed": True,
            "rcmd_default": "ssh",
            "profile": None,
            "genders": {"exists": True, "block": ["gpu-a01 trainfleet"], "outside": [], "broken": None},
            "machines": {"exists": False, "block": None, "outside": [], "broken": None},
        }
    """

    def command(self) -> StringCommand:
        return StringCommand(
            "sh",
            "-c",
            QuoteString(_SCRIPT),
            "trainfleet",
            PDSH_RCMD_DEFAULT,
            PDSH_PROFILE,
            PDSH_GENDERS,
            PDSH_MACHINES,
        )

    def process(self, output: list[str]) -> PdshStateT:
        files = read_file_lines(output)
        head = {
            key: value.strip()
            for key, _, value in (
                line.partition(" ") for line in output if not line.startswith("file ")
            )
        }
        rcmd = file_text(files.get(PDSH_RCMD_DEFAULT))
        return {
            "os": os_release(head),
            "installed": head.get("pdsh", "missing") != "missing",
            "rcmd_default": rcmd.strip() or None if rcmd is not None else None,
            "profile": file_text(files.get(PDSH_PROFILE)),
            "genders": block_state(files.get(PDSH_GENDERS), PDSH_PURPOSE),
            "machines": block_state(files.get(PDSH_MACHINES), PDSH_PURPOSE),
        }
