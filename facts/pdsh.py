"""Facts of pdsh: the OS family it is installed for, and its configuration files."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.managed_block import FILE_FN, BlockState, block_state, file_text, read_file_lines
from trainfleet.defaults import PDSH_GENDERS, PDSH_MACHINES, PDSH_PROFILE, PDSH_RCMD_DEFAULT

PDSH_PURPOSE = "pdsh nodes"

_SCRIPT = FILE_FN + r"""
( . /etc/os-release 2>/dev/null; echo "id ${ID:-unknown}"; echo "like ${ID_LIKE:-}"; echo "version ${VERSION_ID:-}" )
echo "pdsh $(command -v pdsh || echo missing)"
for f in "$@"; do tf_file "$f" "$f"; done
"""


class OsFamilyT(TypedDict):
    id: str
    family: str  # debian | rhel | unknown
    version: str
    package_manager: str | None  # apt | dnf | yum


class PdshStateT(TypedDict):
    os: OsFamilyT
    installed: bool
    rcmd_default: str | None
    profile: str | None
    genders: BlockState
    machines: BlockState


def os_family(os_id: str, like: str, version: str) -> OsFamilyT:
    """Map /etc/os-release's ID, ID_LIKE and VERSION_ID to a family and its package manager."""
    ids = {os_id, *like.split()}
    if ids & {"debian", "ubuntu"}:
        return {"id": os_id, "family": "debian", "version": version, "package_manager": "apt"}
    if ids & {"rhel", "centos", "fedora", "rocky", "almalinux"}:
        manager = "yum" if version.split(".")[0] == "7" else "dnf"
        return {"id": os_id, "family": "rhel", "version": version, "package_manager": manager}
    return {"id": os_id, "family": "unknown", "version": version, "package_manager": None}


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
        return StringCommand("sh", "-c", QuoteString(_SCRIPT), "trainfleet",
                             PDSH_RCMD_DEFAULT, PDSH_PROFILE, PDSH_GENDERS, PDSH_MACHINES)

    def process(self, output: list[str]) -> PdshStateT:
        files = read_file_lines(output)
        head = {key: value.strip() for key, _, value in (line.partition(" ") for line in output
                                                         if not line.startswith("file "))}
        rcmd = file_text(files.get(PDSH_RCMD_DEFAULT))
        return {
            "os": os_family(head.get("id", "unknown"), head.get("like", ""), head.get("version", "")),
            "installed": head.get("pdsh", "missing") != "missing",
            "rcmd_default": rcmd.strip() or None if rcmd is not None else None,
            "profile": file_text(files.get(PDSH_PROFILE)),
            "genders": block_state(files.get(PDSH_GENDERS), PDSH_PURPOSE),
            "machines": block_state(files.get(PDSH_MACHINES), PDSH_PURPOSE),
        }
