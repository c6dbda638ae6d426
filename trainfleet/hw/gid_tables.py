"""GID tables as the RDMA tools print them, read into the NcclNetwork fact's shape
(``{"index", "type", "gid", "ndev"}`` per ``(device, port)``; ``type`` as sysfs names it,
``RoCE_v2`` / ``IB/RoCE_v1``).

- ``show_gids`` (MLNX OFED's script): ``DEV PORT INDEX GID [IPv4] VER [DEV]`` rows, the IPv4
  and netdev columns empty where there is none; tabs often expanded in pasted copies.
- ``ibv_devinfo -v``: ``GID[  3]:  ::ffff:200.0.209.6, RoCE v2`` lines under ``hca_id:`` and
  ``port:`` headers (a pasted excerpt without those names its device and port by argument).

A row that fits neither is refused with its text, never skipped.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import TypedDict


class GidRow(TypedDict):
    index: int
    type: str
    gid: str
    ndev: str | None


PortGids = dict[tuple[str, int], list[GidRow]]
TYPES = MappingProxyType(
    {"v1": "IB/RoCE_v1", "v2": "RoCE_v2", "RoCE v1": "IB/RoCE_v1", "RoCE v2": "RoCE_v2"}
)
_SHOW_ROW = re.compile(
    r"(?P<dev>[A-Za-z0-9_.-]+)\s+(?P<port>\d+)\s+(?P<index>\d+)\s+(?P<gid>[0-9a-fA-F:.]+)"
    r"(?:\s+(?P<ipv4>\d+\.\d+\.\d+\.\d+))?\s+(?P<ver>v[12])(?:\s+(?P<ndev>\S+))?\s*"
)
_DEVINFO_GID = re.compile(r"GID\[\s*(\d+)\]:\s*([0-9a-fA-F:.]+)(?:,\s*(RoCE v[12]))?\s*")
_DEVINFO_HCA = re.compile(r"hca_id:\s*(\S+)")
_DEVINFO_PORT = re.compile(r"port:\s*(\d+)")


class GidsRefused(ValueError):
    """A GID table line that cannot be read."""


def _skipped_show_line(line: str) -> bool:
    text = line.strip()
    return (
        not text
        or text.startswith(("DEV", "---", "n_gids_found"))
        or "#" in text.split()[0]  # the prompt line a pasted copy starts with
    )


def parse_show_gids(text: str) -> PortGids:
    """``show_gids`` output: each port's GIDs in index order."""
    table: PortGids = {}
    for line in text.splitlines():
        if _skipped_show_line(line):
            continue
        row = _SHOW_ROW.fullmatch(line.strip())
        if row is None:
            raise GidsRefused(f"not a show_gids row: {line.strip()!r}")
        key = (row["dev"], int(row["port"]))
        table.setdefault(key, []).append(
            GidRow(
                index=int(row["index"]),
                type=TYPES[row["ver"]],
                gid=row["gid"],
                ndev=row["ndev"],
            )
        )
    return table


def parse_ibv_devinfo(text: str, device: str | None = None, port: int = 1) -> PortGids:
    """``ibv_devinfo -v``'s GID lines, under their ``hca_id``/``port`` (else ``device``,
    ``port``). It names no netdev and, on old builds, no type: an untyped GID is refused."""
    table: PortGids = {}
    for line in text.splitlines():
        if hca := _DEVINFO_HCA.search(line):
            device = hca[1]
        elif (number := _DEVINFO_PORT.fullmatch(line.strip())) is not None:
            port = int(number[1])
        elif "GID[" in line:
            gid = _DEVINFO_GID.search(line)
            if gid is None or gid[3] is None or device is None:
                raise GidsRefused(f"not a typed GID line of a named device: {line.strip()!r}")
            table.setdefault((device, port), []).append(
                GidRow(index=int(gid[1]), type=TYPES[gid[3]], gid=gid[2], ndev=None)
            )
    return table
