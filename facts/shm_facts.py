"""Stale System V shared memory: segments no process is attached to.

A multi-card run that crashes can leave System V segments behind: they hold their memory
until removed (``ipcrm``), and ``ipcs -m`` shows them with ``nattch`` 0.
The fact reads ``/proc/sysvipc/shm``, which is what ``ipcs`` reads, so it needs no tool.
"""

from __future__ import annotations

import re
from typing import TypedDict

from pyinfra.api import FactBase

# The kernel's table (one header line), then the node's clock for the segments' ages.
_COMMAND = 'cat /proc/sysvipc/shm 2>/dev/null; echo "now $(date +%s)"'


class Segment(TypedDict):
    shmid: int
    key: str  # "0x5b1e0f2a"; "0x00000000" for IPC_PRIVATE
    bytes: int
    owner_uid: int
    creator_pid: int
    last_pid: int
    idle_seconds: int  # since the last detach (or creation, if never attached)


SHMID_MAX = 2**31 - 1  # shmids are non-negative C ints
# The columns the parser reads, as the kernel prints them: the key signed, the rest unsigned.
# Only ASCII digits: an id that reaches ipcrm's command line is exactly a number.
_ROW = re.compile(r"\s*(-?[0-9]+)" + r"\s+([0-9]+)" * 13 + r"(\s.*)?", re.ASCII)
_NOW = re.compile(r"now ([0-9]+)", re.ASCII)


def parse_sysvipc_shm(lines: list[str]) -> list[Segment]:
    """The segments with no process attached, from ``/proc/sysvipc/shm`` plus a ``now N`` line.
    A line that is not such a row (the header, anything else) is skipped.

    Columns: key shmid perms size cpid lpid nattch uid gid cuid cgid atime dtime ctime rss swap
    """
    now = next((int(m.group(1)) for m in map(_NOW.fullmatch, lines) if m), 0)
    stale: list[Segment] = []
    for line in lines:
        row = _ROW.fullmatch(line.rstrip("\r\n"))
        if not row or int(row.group(2)) > SHMID_MAX:
            continue
        fields = row.groups()[:14]
        if int(fields[6]) != 0:
            continue
        last_used = max(int(fields[12]), int(fields[13]))  # dtime, ctime
        stale.append(
            {
                "shmid": int(fields[1]),
                "key": f"0x{int(fields[0]) & 0xFFFFFFFF:08x}",
                "bytes": int(fields[3]),
                "owner_uid": int(fields[7]),
                "creator_pid": int(fields[4]),
                "last_pid": int(fields[5]),
                "idle_seconds": max(0, now - last_used) if now else 0,
            }
        )
    return stale


class StaleSharedMemory(FactBase[list[Segment]]):
    """
    System V shared memory segments on the node that no process is attached to (``nattch`` 0).

    .. code:: python

        [{"shmid": 32769, "key": "0x5b1e0f2a", "bytes": 2147483648, "owner_uid": 0,
          "creator_pid": 41233, "last_pid": 41260, "idle_seconds": 5400}]
    """

    def command(self) -> str:
        return _COMMAND

    def process(self, output: list[str]) -> list[Segment]:
        return parse_sysvipc_shm(output)

    @staticmethod
    def default() -> list[Segment]:
        return []
