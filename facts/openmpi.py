"""Facts of OpenMPI on a node: which OpenMPI answers ``mpirun``, and each user's MCA
parameter file (``~/.openmpi/mca-params.conf``) split around trainfleet's block."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.managed_block import MISSING, SECTION, BlockState, block_state, split_sections

MCA_PURPOSE = "openmpi network"
MCA_FILE = ".openmpi/mca-params.conf"  # relative to the user's home

# One command: mpirun's version line, then per user its home, group and parameter file.
_SCRIPT = r"""
sep=$1 missing=$2 file=$3; shift 3
echo "version $(mpirun --version 2>/dev/null | head -n 1)"
for u in "$@"; do
  entry=$(getent passwd "$u") || { echo "$sep $u"; echo "nouser"; continue; }
  home=$(echo "$entry" | cut -d: -f6); gid=$(echo "$entry" | cut -d: -f4)
  echo "$sep $u"
  echo "home $home"; echo "group $(getent group "$gid" | cut -d: -f1)"
  echo "$sep $u:file"
  cat "$home/$file" 2>/dev/null || echo "$missing"
done
"""


class UserParams(TypedDict):
    exists: bool
    home: str | None
    group: str | None
    params: BlockState


class OpenMpiT(TypedDict):
    version: str | None  # "4.1.4"; None: no mpirun on the PATH
    users: dict[str, UserParams]


def _version(line: str) -> str | None:
    # "mpirun (Open MPI) 4.1.4"; other MPIs print their own names (kept whole).
    text = line.strip()
    if not text:
        return None
    return text.rsplit(" ", 1)[-1] if "Open MPI" in text else text


class OpenMpiState(FactBase[OpenMpiT]):
    """
    OpenMPI on the node and every given user's ``~/.openmpi/mca-params.conf``, in one command.

    + users: the users whose parameter files to read (the mesh users)

    .. code:: python

        {
            "version": "4.1.4",
            "users": {"root": {"exists": True, "home": "/root", "group": "root",
                               "params": {"exists": True, "block": ["btl_tcp_if_include = eth0", ...],
                                          "outside": [], "broken": None}}},
        }
    """

    def command(self, users: list[str]) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(_SCRIPT), "trainfleet", SECTION, MISSING, MCA_FILE,
                             *(QuoteString(u) for u in users))

    def process(self, output: list[str]) -> OpenMpiT:
        head, sections = split_sections(output)
        version = next((line[len("version "):] for line in head if line.startswith("version")), "")
        users: dict[str, UserParams] = {}
        for name, lines in sections.items():
            if name.endswith(":file"):
                continue
            if not lines or lines == ["nouser"]:
                users[name] = {"exists": False, "home": None, "group": None, "params": block_state(None, MCA_PURPOSE)}
                continue
            info = {key: value for key, _, value in (line.partition(" ") for line in lines)}
            users[name] = {"exists": True, "home": info.get("home") or None, "group": info.get("group") or None,
                           "params": block_state(sections.get(f"{name}:file"), MCA_PURPOSE)}
        return {"version": _version(version), "users": users}

    @staticmethod
    def default() -> OpenMpiT:
        return {"version": None, "users": {}}
