"""A RoCE port's QoS as the host reads it: plain functions over the tools' and sysfs's text.

- ``mlnx_qos -i <netdev>`` (MLNX OFED / mstflint): the trust state (``pcp``: the VLAN priority
  of a frame decides its priority; ``dscp``: the IP header's DSCP does, through the
  ``dscp2prio`` map), PFC enabled per priority (and, on newer builds, the ``buffer`` row), the
  priority -> traffic class map and each class's scheduling (``tsa``).
- spiderpool's ``rdma-qos.sh q`` reading: the trust and PFC lines of ``mlnx_qos`` grepped out
  (no map, no tc table), with the ECN enables and the two traffic class readings below.
- ``/sys/class/infiniband/<dev>/tc/1/traffic_class``: mlx5's global override, applied by the
  kernel to every RoCE QP of the port (``Global tclass=106``; empty: not set).
- rdma_cm's ``default_roce_tos`` (configfs): the TOS of rdma_cm connections, a number.
- ``/sys/class/net/<netdev>/ecn/roce_np|roce_rp/enable/<prio>``: ECN (DCQCN) per priority, 0/1.

Text that is not what the tool prints is refused (``QosRefused``, naming the line), never
guessed around: a QoS reading decides whether RoCE is lossless.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

PRIORITIES = tuple(range(8))
TRUST_STATES = ("pcp", "dscp")
# Lines mlnx_qos prints that say nothing the traffic class depends on (kept out of the way,
# never skipped blindly: any other line is refused).
_INFO = re.compile(
    r"DCBX mode:.*|Receive buffer size \(bytes\):.*|Total buffer size \(bytes\):.*"
    r"|Cable len:.*|xoff_threshold.*|xon_threshold.*|default priority:.*"
)
_TRUST = re.compile(r"Priority trust state:\s*(\S+)")
_MAP_ROW = re.compile(r"prio:\s*([0-7])\s+dscp:\s*((?:[0-9]{1,2},)*[0-9]{0,2})")
_PFC_HEADER = re.compile(r"priority\s+0\s+1\s+2\s+3\s+4\s+5\s+6\s+7")
_PFC_ROW = re.compile(r"(enabled|buffer)((?:\s+[0-9]{1,10}){8})")
_TC = re.compile(
    r"tc:\s*([0-7])\s+ratelimit:\s*([^,]+),\s*tsa:\s*([A-Za-z_]+)(?:,\s*bw:\s*([0-9]{1,3})%)?"
)
_TC_PRIORITY = re.compile(r"priority:\s*([0-7])")
_TCLASS = re.compile(r"Global tclass=([0-9]{1,3})")
_NUMBER = re.compile(r"[0-9]{1,3}")


class QosRefused(ValueError):
    """A QoS reading that is not what the tool or the kernel prints: why, with the line."""


@dataclass(frozen=True)
class MlnxQos:
    """One port's ``mlnx_qos`` reading (``partial``: a reading that greps only the trust and
    PFC lines, as spiderpool's does: no map, no tc table)."""

    trust: str  # "pcp" | "dscp"
    pfc: tuple[bool, ...]  # PFC enabled (lossless), per priority 0..7
    buffer: tuple[int, ...] | None = None  # the receive buffer of each priority (newer builds)
    dscp2prio: Mapping[int, int] | None = None  # DSCP -> priority; None where not printed
    prio2tc: Mapping[int, int] = field(default_factory=dict)  # priority -> traffic class
    tsa: Mapping[int, str] = field(default_factory=dict)  # traffic class -> "vendor", "ets"...

    @property
    def pfc_priorities(self) -> tuple[int, ...]:
        return tuple(p for p in PRIORITIES if self.pfc[p])

    def dscps_of(self, priority: int) -> tuple[int, ...]:
        """The DSCP values the map sends to ``priority``, lowest first."""
        return tuple(sorted(d for d, p in (self.dscp2prio or {}).items() if p == priority))


class _Reading:
    """What the lines read so far hold (one mlnx_qos output)."""

    def __init__(self) -> None:
        self.trust: str | None = None
        self.rows: dict[str, tuple[int, ...]] = {}
        self.header = False
        self.dscp2prio: dict[int, int] | None = None
        self.prio2tc: dict[int, int] = {}
        self.tsa: dict[int, str] = {}
        self.tc: int | None = None

    def take(self, line: str) -> bool:
        """Read one stripped line; False where it is none of mlnx_qos's."""
        if _INFO.fullmatch(line):
            return True
        if trust := _TRUST.fullmatch(line):
            if trust[1] not in TRUST_STATES or self.trust is not None:
                raise QosRefused(f"not one trust state of {TRUST_STATES}: {line!r}")
            self.trust = trust[1]
        elif line == "dscp2prio mapping:":
            self.dscp2prio = {}
        elif (row := _MAP_ROW.fullmatch(line)) and self.dscp2prio is not None:
            self._map_row(int(row[1]), row[2], line)
        elif line == "PFC configuration:":
            self.header = False
        elif _PFC_HEADER.fullmatch(line):
            self.header = True
        elif (pfc := _PFC_ROW.fullmatch(line)) and self.header and pfc[1] not in self.rows:
            self.rows[pfc[1]] = tuple(int(v) for v in pfc[2].split())
        elif tc := _TC.fullmatch(line):
            self.tc = int(tc[1])
            self.tsa[self.tc] = tc[3]
        elif (priority := _TC_PRIORITY.fullmatch(line)) and self.tc is not None:
            if int(priority[1]) in self.prio2tc:
                raise QosRefused(f"priority {priority[1]} in two traffic classes: {line!r}")
            self.prio2tc[int(priority[1])] = self.tc
        else:
            return False
        return True

    def _map_row(self, priority: int, dscps: str, line: str) -> None:
        assert self.dscp2prio is not None
        for text in filter(None, dscps.split(",")):
            dscp = int(text)
            if dscp > 63 or dscp in self.dscp2prio:
                raise QosRefused(f"DSCP {dscp} is no DSCP or is mapped twice: {line!r}")
            self.dscp2prio[dscp] = priority


def parse_mlnx_qos(text: str, partial: bool = False) -> MlnxQos:
    """``mlnx_qos -i <netdev>``'s output (the older build, without a ``buffer`` row, and the
    newer, with it). Every line must be one mlnx_qos prints; the trust state and the PFC
    ``enabled`` row must be there, and with ``dscp`` trust the DSCP map (``partial``: a
    reading that kept only the trust and PFC lines)."""
    reading = _Reading()
    for line in text.splitlines():
        if line.strip() and not reading.take(line.strip()):
            raise QosRefused(f"not a line mlnx_qos prints: {line.strip()!r}")
    return _checked(reading, partial)


def _checked(reading: _Reading, partial: bool) -> MlnxQos:
    if reading.trust is None:
        raise QosRefused("no 'Priority trust state:' line")
    enabled = reading.rows.get("enabled")
    if enabled is None:
        raise QosRefused("no PFC 'enabled' row under 'priority 0 1 2 3 4 5 6 7'")
    if any(v not in (0, 1) for v in enabled):
        raise QosRefused(f"PFC enabled row holds a value other than 0/1: {enabled}")
    if reading.trust == "dscp" and reading.dscp2prio is None and not partial:
        raise QosRefused("trust state dscp but no 'dscp2prio mapping:' printed")
    if not partial and sorted(reading.prio2tc) != list(PRIORITIES):
        raise QosRefused(
            "the tc table does not place every priority 0..7 in one traffic class "
            f"(placed: {sorted(reading.prio2tc) or 'none'})"
        )
    return MlnxQos(
        trust=reading.trust,
        pfc=tuple(v == 1 for v in enabled),
        buffer=reading.rows.get("buffer"),
        dscp2prio=None if reading.dscp2prio is None else MappingProxyType(reading.dscp2prio),
        prio2tc=MappingProxyType(reading.prio2tc),
        tsa=MappingProxyType(reading.tsa),
    )


def parse_traffic_class(text: str) -> int | None:
    """``tc/1/traffic_class``: the global traffic class the kernel gives every RoCE QP of the
    port (``Global tclass=160``), None where none is set (the file is empty)."""
    value = text.strip()
    if not value:
        return None
    match = _TCLASS.fullmatch(value)
    if match is None or int(match[1]) > 255:
        raise QosRefused(f"not 'Global tclass=<0-255>' nor empty: {value!r}")
    return int(match[1])


def parse_roce_tos(text: str) -> int:
    """rdma_cm's ``default_roce_tos``: a TOS byte, 0-255."""
    value = text.strip()
    if not _NUMBER.fullmatch(value) or int(value) > 255:
        raise QosRefused(f"default_roce_tos is not a number 0-255: {value!r}")
    return int(value)


def parse_enable(text: str) -> bool:
    """An ECN ``enable/<prio>`` file: 1 on, 0 off."""
    value = text.strip()
    if value not in ("0", "1"):
        raise QosRefused(f"an ECN enable file reads neither 0 nor 1: {value!r}")
    return value == "1"


@dataclass(frozen=True)
class SpiderpoolReading:
    """spiderpool's ``rdma-qos.sh q`` output for one netdev / HCA."""

    netdev: str
    device: str
    qos: MlnxQos  # partial: trust and PFC only
    ecn: Mapping[str, bool]  # "roce_np/3" -> on
    cnp_dscp: int | None
    roce_tos: int | None
    traffic_class: int | None


_SP_HEADER = re.compile(r"=+ show configuration for device (\S+) / (\S+?)=+")
_SP_ECN = re.compile(
    r"ECN Enabled for priority ([0-7]): /sys/class/net/(\S+)/ecn/(roce_np|roce_rp)/enable/"
    r"([0-7]) = (\S+)"
)
_SP_CNP = re.compile(r"QOS for CNP: /sys/class/net/\S+/ecn/roce_np/cnp_dscp = ([0-9]{1,2})")
_SP_TOS = re.compile(r"cma_roce_tos: (\S+)")
_SP_TCLASS = re.compile(r"QOS for rdma: /sys/class/infiniband/\S+/tc/1/traffic_class = (.*)")


def parse_spiderpool(text: str) -> SpiderpoolReading:
    """spiderpool's reading (docs/usage/roce-qos.md): its own lines read here, the mlnx_qos
    lines it keeps read as ``parse_mlnx_qos(partial=True)`` does; any other line refused."""
    header, ecn, cnp, tos, tclass = None, {}, None, None, None
    kept = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.endswith("rdma-qos.sh q"):  # the command line itself
            continue
        if match := _SP_HEADER.fullmatch(line):
            header = (match[1], match[2])
        elif match := _SP_ECN.fullmatch(line):
            if match[1] != match[4]:
                raise QosRefused(f"an ECN line names two priorities: {line!r}")
            ecn[f"{match[3]}/{match[4]}"] = parse_enable(match[5])
        elif match := _SP_CNP.fullmatch(line):
            cnp = int(match[1])
        elif match := _SP_TOS.fullmatch(line):
            tos = parse_roce_tos(match[1])
        elif match := _SP_TCLASS.fullmatch(line):
            tclass = parse_traffic_class(match[1])
        else:
            kept.append(line)
    if header is None:
        raise QosRefused("no '==== show configuration for device <netdev> / <hca>====' line")
    return SpiderpoolReading(
        header[0], header[1], parse_mlnx_qos("\n".join(kept), partial=True), ecn, cnp, tos, tclass
    )


# iproute2's dcb(8) (where mlnx_qos is absent): ``dcb pfc show dev X`` and ``dcb app show dev
# X``. Its DSCP names are iproute2's rt_dsfield ones (``-N`` prints numbers instead).
_DCB_PFC_CAP = re.compile(r"pfc-cap [0-9]+ macsec-bypass (?:on|off) delay [0-9]+")
_DCB_PRIO_PFC = re.compile(r"prio-pfc((?: [0-7]:(?:on|off)){8})")
_DCB_STATS = re.compile(r"(?:requests|indications)(?: [0-7]:[0-9]+){8}")
_DCB_SELECTORS = (
    "default-prio",
    "ethtype-prio",
    "stream-port-prio",
    "dgram-port-prio",
    "port-prio",
    "pcp-prio",
)


def _dscp_value(name: str) -> int:
    """A DSCP as dcb prints it: a number, or its rt_dsfield name (CS3, AF31, EF, ...)."""
    if name.isdigit() and int(name) < 64:
        return int(name)
    if name == "default":
        return 0
    if re.fullmatch(r"CS[0-7]", name):
        return 8 * int(name[2])
    if re.fullmatch(r"AF[1-4][1-3]", name):
        return 8 * int(name[2]) + 2 * int(name[3])
    if name in ("EF", "VA", "LE"):
        return {"EF": 46, "VA": 44, "LE": 1}[name]
    raise QosRefused(f"not a DSCP dcb prints: {name!r}")


def parse_dcb_pfc(text: str) -> tuple[bool, ...]:
    """``dcb pfc show dev X``: PFC enabled per priority 0..7 (``prio-pfc``, required)."""
    pfc: tuple[bool, ...] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _DCB_PFC_CAP.fullmatch(line) or _DCB_STATS.fullmatch(line):
            continue
        match = _DCB_PRIO_PFC.fullmatch(line)
        if match is None or pfc is not None:
            raise QosRefused(f"not a line dcb pfc show prints once: {line!r}")
        cells = dict(cell.split(":") for cell in match[1].split())
        if sorted(cells) != [str(p) for p in PRIORITIES]:
            raise QosRefused(f"prio-pfc does not name each priority 0..7 once: {line!r}")
        pfc = tuple(cells[str(p)] == "on" for p in PRIORITIES)
    if pfc is None:
        raise QosRefused("no 'prio-pfc' line")
    return pfc


def parse_dcb_app(text: str) -> dict[int, int]:
    """``dcb app show dev X``'s ``dscp-prio`` entries: DSCP -> priority (the DSCPs the table
    does not name are not in it: the NIC's default applies to them, unknown here)."""
    mapping: dict[int, int] = {}
    for raw in text.splitlines():
        words = raw.split()
        if not words or words[0] in _DCB_SELECTORS:
            continue
        if words[0] != "dscp-prio":
            raise QosRefused(f"not a line dcb app show prints: {raw.strip()!r}")
        for entry in words[1:]:
            dscp, _, priority = entry.partition(":")
            if not re.fullmatch(r"[0-7]", priority) or _dscp_value(dscp) in mapping:
                raise QosRefused(f"not one DSCP:priority entry: {entry!r}")
            mapping[_dscp_value(dscp)] = int(priority)
    return mapping
