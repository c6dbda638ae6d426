"""Facts of pdsh: the OS family it is installed for, and its configuration files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import (
    BLOCK_FN,
    BlockState,
    block_args,
    block_file_answer,
    block_or_digest,
    file_text,
    read_file_lines,
    with_files,
)
from facts.os_release_facts import OS_FAMILY_SH
from facts.shell import shell
from trainfleet.defaults import PDSH_GENDERS, PDSH_MACHINES, PDSH_PROFILE, PDSH_RCMD_DEFAULT
from trainfleet.osfamily import OsFamilyT, os_release

PDSH_PURPOSE = "pdsh nodes"

_SCRIPT = (
    BLOCK_FN
    + "\n"
    + OS_FAMILY_SH
    + r"""
echo "pdsh $(command -v pdsh || echo missing)"
tf_file "$1" "$1"; tf_file "$2" "$2"; shift 2
tf_block "$1" "$@"; shift 4; tf_block "$1" "$@"
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

    + genders, machines: the blocks the plan wants: a node that holds one answers its
      digest instead of its lines (``tf_block``)

    .. code:: python

        {
            "os": {"id": "debian", "family": "debian", "version": "12", "package_manager": "apt"},
            "installed": True,
            "rcmd_default": "ssh",
            "profile": None,
            "genders": {"exists": True, "block": ["gpu-a01 trainfleet"], "outside": [],
                        "broken": None},
            "machines": {"exists": False, "block": None, "outside": [], "broken": None},
        }
    """

    def command(
        self, genders: list[str] | None = None, machines: list[str] | None = None
    ) -> StringCommand:
        self.expect = {PDSH_GENDERS: genders, PDSH_MACHINES: machines}
        args = [
            *block_args(PDSH_GENDERS, PDSH_PURPOSE, genders),
            *block_args(PDSH_MACHINES, PDSH_PURPOSE, machines),
        ]
        return shell(_SCRIPT, PDSH_RCMD_DEFAULT, PDSH_PROFILE, *args)

    def process(self, output: list[str]) -> PdshStateT:
        files = read_file_lines(output)
        head = {
            key: value.strip()
            for key, _, value in (
                line.partition(" ") for line in output if not line.startswith("file ")
            )
        }
        rcmd = file_text(files.get(PDSH_RCMD_DEFAULT))
        expect = getattr(self, "expect", {PDSH_GENDERS: None, PDSH_MACHINES: None})
        return {
            "os": os_release(head),
            "installed": head.get("pdsh", "missing") != "missing",
            "rcmd_default": rcmd.strip() or None if rcmd is not None else None,
            "profile": file_text(files.get(PDSH_PROFILE)),
            "genders": block_or_digest(output, PDSH_GENDERS, PDSH_PURPOSE, expect[PDSH_GENDERS]),
            "machines": block_or_digest(output, PDSH_MACHINES, PDSH_PURPOSE, expect[PDSH_MACHINES]),
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What a node answers this command once ``value``'s genders and machines blocks are
        written in its files as ``recorded`` holds them (the controller benchmark's converged
        node; the rest of ``recorded`` is the node's own)."""
        expect = getattr(self, "expect", {PDSH_GENDERS: None, PDSH_MACHINES: None})

        def answer(path: str, key: str) -> Callable[[str], list[str]]:
            return lambda line: block_file_answer(
                line, PDSH_PURPOSE, value[key]["block"], expect[path]
            )

        return with_files(
            recorded,
            {
                PDSH_GENDERS: answer(PDSH_GENDERS, "genders"),
                PDSH_MACHINES: answer(PDSH_MACHINES, "machines"),
            },
        )
