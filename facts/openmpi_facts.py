"""Facts of OpenMPI on a node: which OpenMPI answers ``mpirun``, and each user's MCA
parameter file (``~/.openmpi/mca-params.conf``) split around trainfleet's block."""

from __future__ import annotations

from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.managed_block_facts import (
    AS_USER_FN,
    FILE_FN,
    BlockState,
    block_state,
    decode_lines,
    encode_lines,
    read_file_lines,
    with_block_line,
)
from facts.shell import script, shell
from trainfleet.defaults import MCA_FILE  # noqa: F401  (operations read it from here)

MCA_PURPOSE = "openmpi network"

# One command: mpirun's version line, then per user its home, group and parameter file.
_SCRIPT = AS_USER_FN + script("openmpi.sh")

# Read as the user: the parameter file in the user's home.
_USER_PART = FILE_FN + 'tf_file params "$1"'


class UserParams(TypedDict):
    exists: bool
    home: str | None
    group: str | None
    uid: str | None
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
                               "params": {"exists": True,
                                          "block": ["btl_tcp_if_include = eth0", ...],
                                          "outside": [], "broken": None}}},
        }
    """

    def command(self, users: list[str]) -> StringCommand:
        return shell(_SCRIPT, MCA_FILE, _USER_PART, *users)

    def process(self, output: list[str]) -> OpenMpiT:
        version = next(
            (line[len("version ") :] for line in output if line.startswith("version")), ""
        )
        users: dict[str, UserParams] = {}
        for line in output:
            if not line.startswith("user "):
                continue
            fields = line.split(" ")
            if fields[2:] == ["nouser"]:
                users[fields[1]] = {
                    "exists": False,
                    "home": None,
                    "group": None,
                    "uid": None,
                    "params": block_state(None, MCA_PURPOSE),
                }
                continue
            if len(fields) != 6:
                raise FactProcessError(f"unreadable user line: {line[:80]!r}")
            _, name, uid, group, home, part = fields
            files = read_file_lines(decode_lines(part))
            if "params" not in files:
                raise FactProcessError(f"{name}'s {MCA_FILE} could not be read (as {name})")
            users[name] = {
                "exists": True,
                "home": "\n".join(decode_lines(home)) or None,
                "group": group or None,
                "uid": uid,
                "params": block_state(files["params"], MCA_PURPOSE),
            }
        return {"version": _version(version), "users": users}

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What a node answers once each of ``value``'s users' parameter files holds its block
        (written first, as operations/openmpi_ops.py writes it) in the file ``recorded`` holds
        (the controller benchmark's converged node; version and homes are the node's own)."""
        out = []
        for line in recorded:
            fields = line.split(" ")
            params = value["users"].get(fields[1]) if len(fields) == 6 else None
            if fields[0] == "user" and params is not None:
                fields[5] = encode_lines(
                    [
                        with_block_line(each, MCA_PURPOSE, params["params"]["block"], top=True)
                        if each.startswith("file params ")
                        else each
                        for each in decode_lines(fields[5])
                    ]
                )
            out.append(" ".join(fields))
        return out

    @staticmethod
    def default() -> OpenMpiT:
        return {"version": None, "users": {}}
