"""``nvidia-smi topo -m``: how each GPU reaches each NIC (PIX, PXB, PHB, NODE, SYS), and the
NIC legend's device names (``NIC0: mlx5_0``).

nvidia-smi writes TAB-separated cells (``X`` as `` X ``); pasted copies have the tabs expanded,
and its terminal output underlines the header with ANSI escapes: cells are split on runs of
whitespace, escapes dropped. A matrix whose NICs cannot be named (no NIC legend), or whose
legend, rows and columns disagree, is refused with the reason: a NIC's name is never guessed
from its column (``NIC3`` is not ``mlx5_3`` on a node whose storage HCA sits between rails).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# The relations nvidia-smi prints (its own legend): X is the device itself, NV# a GPU pair's
# NVLinks. PIX/PXB: under the same PCIe switch (no host bridge crossed).
RELATION = re.compile(r"X|SYS|NODE|PHB|PXB|PIX|NV[0-9]{1,3}")
SAME_SWITCH = ("PIX", "PXB")
_DEVICE = re.compile(r"(GPU|NIC)([0-9]{1,3})")
_LEGEND_LINE = re.compile(r"(NIC[0-9]{1,3}):\s*([A-Za-z0-9_.-]{1,64})")
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class TopoRefused(ValueError):
    """Why a ``topo -m`` text cannot be read as a GPU x NIC matrix with named NICs."""


@dataclass(frozen=True)
class Topology:
    gpus: tuple[str, ...]  # "GPU0", ... in the matrix's order
    nics: Mapping[str, str]  # "NIC0" -> its device name from the NIC legend, e.g. "mlx5_0"
    relation: Mapping[tuple[str, str], str]  # ("GPU0", "NIC0") -> "PIX"

    def gpus_beside(self, nic: str) -> tuple[str, ...]:
        """The GPUs under the same PCIe switch as ``nic`` (PIX or PXB)."""
        return tuple(g for g in self.gpus if self.relation[(g, nic)] in SAME_SWITCH)

    def nearest(self, nic: str) -> str:
        """The closest relation ``nic`` has to any GPU (its set of relations, if none is near),
        for saying why a NIC is not a rail."""
        return "/".join(sorted({self.relation[(g, nic)] for g in self.gpus}))


def _matrix(lines: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(column names, {row name: its cells}) of the matrix at the top of ``lines``."""
    header_at = next((i for i, line in enumerate(lines) if line.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise TopoRefused("no matrix header (a line starting with GPU0)")
    columns = []
    for token in lines[header_at].split():
        if not _DEVICE.fullmatch(token):
            break  # "CPU Affinity" and what follows are not devices
        columns.append(token)
    rows: dict[str, list[str]] = {}
    for line in lines[header_at + 1 :]:
        cells = line.split()
        if not cells or not _DEVICE.fullmatch(cells[0]):
            break  # the blank line before "Legend:"
        name, values = cells[0], cells[1 : 1 + len(columns)]
        if name in rows:
            raise TopoRefused(f"{name}'s row appears twice")
        if len(values) < len(columns) or not all(RELATION.fullmatch(v) for v in values):
            raise TopoRefused(f"{name}'s row is not {len(columns)} relations: {line.strip()!r}")
        rows[name] = values
    return columns, rows


def _legend(lines: list[str]) -> dict[str, str] | None:
    """The NIC legend (None where the text has no "NIC Legend:" line)."""
    at = next((i for i, line in enumerate(lines) if line.strip() == "NIC Legend:"), None)
    if at is None:
        return None
    legend: dict[str, str] = {}
    for line in lines[at + 1 :]:
        if not line.strip():
            continue
        match = _LEGEND_LINE.fullmatch(line.strip())
        if not match:
            raise TopoRefused(f"NIC legend line is not 'NICn: device': {line.strip()!r}")
        nic, device = match.groups()
        if nic in legend:
            raise TopoRefused(f"the NIC legend names {nic} twice")
        legend[nic] = device
    if len(set(legend.values())) < len(legend):
        raise TopoRefused("the NIC legend gives one device name to two NICs")
    return legend


def parse(text: str) -> Topology:
    """The GPU x NIC relations and the NICs' names, or TopoRefused saying why not."""
    lines = [_ESCAPE.sub("", line) for line in text.splitlines()]
    columns, rows = _matrix(lines)
    gpus = tuple(c for c in columns if c.startswith("GPU"))
    nics = [c for c in columns if c.startswith("NIC")]
    if not gpus:
        raise TopoRefused("the matrix has no GPU column")
    legend = _legend(lines)
    if nics and legend is None:
        raise TopoRefused(
            f"no NIC legend: {', '.join(nics)} cannot be named (NICn is not guessed as mlx5_n)"
        )
    if missing := [c for c in columns if c not in rows]:
        raise TopoRefused(f"columns without a row: {', '.join(missing)} (a cut-off matrix?)")
    if extra := [r for r in rows if r not in columns]:
        raise TopoRefused(f"rows without a column: {', '.join(extra)}")
    legend = legend or {}
    if set(legend) != set(nics):
        unnamed = sorted(set(nics) - set(legend), key=_number)
        unknown = sorted(set(legend) - set(nics), key=_number)
        raise TopoRefused(
            "the NIC legend and the matrix disagree: "
            + "; ".join(
                part
                for part in (
                    unnamed and f"not in the legend: {', '.join(unnamed)}",
                    unknown and f"in the legend, not in the matrix: {', '.join(unknown)}",
                )
                if part
            )
        )
    relation: dict[tuple[str, str], str] = {}
    for gpu in gpus:
        for nic in nics:
            seen, back = rows[gpu][columns.index(nic)], rows[nic][columns.index(gpu)]
            if seen != back:
                raise TopoRefused(f"{gpu}-{nic} reads {seen} in {gpu}'s row, {back} in {nic}'s")
            relation[(gpu, nic)] = seen
    return Topology(gpus=gpus, nics={nic: legend[nic] for nic in nics}, relation=relation)


def _number(name: str) -> int:
    return int(name[3:])
