"""Error counters under trainfleet's own load: each InfiniBand port's error counters, each GPU's
PCIe replay counter and each NVLink's error counters read before and after the preflight's
bandwidth stage; a port, GPU or link whose errors grew while the stage drove traffic through it
is named (symbol errors, link downs and recoveries, receive errors, PCIe replays, NVLink replay,
recovery and CRC errors: a link that flaps or degrades under load passes an idle check).

RoCE ports under the same load (#40): each port's hw_counters (retransmits: out_of_sequence,
local_ack_timeout_err, rnr_nak_retry_err, roce_adp_retrans, roce_slow_restart*; congestion:
np_cnp_sent, np_ecn_marked_roce_packets, rp_cnp_handled) and the pause frames of its netdevs
(``ethtool -S``: rx/tx_prio<N>_pause, rx/tx_pause_ctrl_phy). Retransmits that grew while no
pause frame did name "flow control not effective" for that node and rail; with pauses growing
they are congestion, a figure; CNPs and ECN marks are figures; a counter not read is named "not
read", never a pass. Plain functions."""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from checks.preflight_report import Problem
from trainfleet.hw import nvlink, smi_xml
from trainfleet.hw.infiniband import CONGESTION_COUNTERS, ERROR_COUNTERS, RETRANSMIT_COUNTERS
from trainfleet.text import printable

_LINE = re.compile(r"ib ([A-Za-z0-9_]{1,32}) ([0-9]{1,3}) ([A-Za-z0-9_]{1,64}) ([0-9]{1,20})")
_HW = re.compile(r"hw ([A-Za-z0-9_]{1,32}) ([0-9]{1,3}) ([A-Za-z0-9_]{1,64}) ([0-9]{1,20})")
_LAYER = re.compile(r"layer ([A-Za-z0-9_]{1,32}) ([0-9]{1,3}) (Ethernet|InfiniBand)")
_NETDEV = "[A-Za-z0-9_.@-]{1,15}"  # a name the kernel gives (IFNAMSIZ)
_NDEV = re.compile(rf"ndev ([A-Za-z0-9_]{{1,32}}) ([0-9]{{1,3}}) ({_NETDEV})")
_PAUSE = re.compile(
    rf"pause ({_NETDEV}) ((?:rx|tx)_(?:prio[0-7]_pause|pause_ctrl_phy)) ([0-9]{{1,20}})"
)
# (HCA, port, counter) -> value. RoCE readings ride in the same map, their counter named by
# where it came from: "hw_counters/out_of_sequence", markers "link_layer/Ethernet" and
# "netdev/ens1f0" (value 1), and each netdev's pause counters as ("ethtool", NETDEV, counter).
Counters = dict[tuple[str, str, str], int]
HW = "hw_counters/"
ETHTOOL = "ethtool"


PCIE = "PCIe"  # the "port" of a GPU's replay counter
NVLINK = "NVLink "  # the "port" of an NVLink's counters: "NVLink 3"


def _decoded(line: str) -> bytes | None:
    """A tagged line's base64 payload ("smi BASE64"), or None where it is not base64."""
    try:
        return base64.b64decode(line[4:], validate=True)
    except (ValueError, binascii.Error):
        return None


def read_counters(lines: list[str]) -> Counters:
    """``counters.sh``'s lines as numbers (anything else is not a counter line; an
    nvidia-smi document that cannot be read gives no GPU counter)."""
    found: Counters = {}
    for line in lines:
        if (m := _LINE.fullmatch(line.strip())) and m.group(3) in ERROR_COUNTERS:
            found[(m.group(1), m.group(2), m.group(3))] = int(m.group(4))
        elif m := _HW.fullmatch(line.strip()):
            found[(m.group(1), m.group(2), HW + m.group(3))] = int(m.group(4))
        elif m := _LAYER.fullmatch(line.strip()):
            found[(m.group(1), m.group(2), f"link_layer/{m.group(3)}")] = 1
        elif m := _NDEV.fullmatch(line.strip()):
            found[(m.group(1), m.group(2), f"netdev/{m.group(3)}")] = 1
        elif m := _PAUSE.fullmatch(line.strip()):
            found[(ETHTOOL, m.group(1), m.group(2))] = int(m.group(3))
        elif line.startswith("smi ") and (document := _decoded(line)) is not None:
            try:
                gpus = smi_xml.gpus(smi_xml.smi_root(document))
            except ValueError:
                continue
            for gpu in gpus:
                if gpu["replays"] is not None:
                    found[(gpu["bus"], PCIE, "replays")] = gpu["replays"]
        elif line.startswith("nvl ") and (text := _decoded(line)) is not None:
            for (gpu, link, name), value in nvlink.error_counters(
                text.decode("utf-8", "replace")
            ).items():
                found[(f"GPU {gpu}", f"{NVLINK}{link}", name)] = value
    return found


def counter_problems(
    before: dict[str, Counters], after: dict[str, Counters], watched: list[str] | None = None
) -> list[Problem]:
    """A port whose error counter grew between the two readings, per node; a ``watched`` node
    (one with GPUs or HCA ports) whose counters could not be read either time fails: the check
    saw nothing there. A counter that went down was reset (or wrapped) in between: nothing can
    be said of it."""
    problems = [
        Problem(
            "bandwidth",
            node,
            "its error counters (InfiniBand, PCIe replays, NVLink) could not be read "
            + ("before" if not before.get(node) else "after")
            + " the bandwidth stage: whether its links held under load is unknown",
        )
        for node in watched or []
        if not before.get(node) or not after.get(node)
    ]
    for node, now in after.items():
        grew = [
            f"GPU {printable(hca, 32)} PCIe replays {before[node][key]} -> {value}"
            if port == PCIE
            else f"{hca} {port} {printable(name, 64)} {before[node][key]} -> {value}"
            if port.startswith(NVLINK)
            else f"{printable(hca, 32)} port {port} {name} {before[node][key]} -> {value}"
            for key, value in sorted(now.items())
            if key in before.get(node, {}) and value > before[node][key] and not _roce(key)
            for hca, port, name in [key]
        ]
        gone = sorted(key for key in before.get(node, {}) if key not in now)
        if now and gone:
            problems.append(
                Problem(
                    "bandwidth",
                    node,
                    "error counters read before the bandwidth stage could not be read after "
                    "it: "
                    + ", ".join(printable(" ".join(key), 120) for key in gone[:8])
                    + (f" and {len(gone) - 8} more" if len(gone) > 8 else "")
                    + ": a device may have gone (a GPU off the bus, an HCA reset) or its tool "
                    "timed out",
                )
            )
        if grew:
            problems.append(
                Problem(
                    "bandwidth",
                    node,
                    "error counters grew under the bandwidth stage's load: "
                    + "; ".join(grew)
                    + ": the link degrades under traffic (InfiniBand: reseat or replace the "
                    "cable or transceiver, check the switch port; PCIe: reseat the GPU, check "
                    "its riser and slot; NVLink: reset the GPU, then check the baseboard and "
                    "NVSwitch)",
                )
            )
    return problems + roce_problems(before, after)


# ---- RoCE under load ----------------------------------------------------------------------


def _roce(key: tuple[str, str, str]) -> bool:
    """A RoCE reading (hw counter, marker, pause), judged by ``roce_problems`` alone."""
    return key[0] == ETHTOOL or "/" in key[2]


def _growth(before: Counters, after: Counters, keys: list[tuple[str, str, str]]) -> int | None:
    """How much ``keys`` grew between the readings, summed over those read both times and not
    reset in between; None: none of them could be read (or each was reset)."""
    grown = [after[k] - before[k] for k in keys if k in before and k in after]
    kept = [g for g in grown if g >= 0]
    return sum(kept) if kept else None


def roce_ports(reading: Counters) -> list[tuple[str, str]]:
    """The (HCA, port) pairs whose link layer is Ethernet (RoCE)."""
    return sorted({(h, p) for h, p, n in reading if n == "link_layer/Ethernet"})


def rail_figures(before: Counters, after: Counters, hca: str, port: str) -> dict[str, Any]:
    """A RoCE port's growth under the stage: retransmits (and each counter that grew), pause
    frames of its netdevs, CNPs sent and handled, ECN-marked packets (None: not read)."""
    netdevs = sorted(
        n[len("netdev/") :]
        for h, p, n in after
        if (h, p) == (hca, port) and n.startswith("netdev/")
    )
    pauses = [k for k in after if k[0] == ETHTOOL and k[1] in netdevs]
    grew = {
        name: after[key] - before[key]
        for name in RETRANSMIT_COUNTERS
        for key in [(hca, port, HW + name)]
        if key in before and key in after and after[key] > before[key]
    }

    def hw(names: tuple[str, ...]) -> int | None:
        return _growth(before, after, [(hca, port, HW + n) for n in names])

    return {
        "netdevs": netdevs,
        "retransmits": hw(RETRANSMIT_COUNTERS),
        "grew": grew,
        "pause_frames": _growth(before, after, pauses),
        "cnp_sent": hw(CONGESTION_COUNTERS[:1]),
        "ecn_marked": hw(CONGESTION_COUNTERS[1:2]),
        "cnp_handled": hw(CONGESTION_COUNTERS[2:]),
    }


def roce_figures(before: dict[str, Counters], after: dict[str, Counters]) -> dict[str, Any]:
    """Each node's RoCE rails' figures under the bandwidth stage: ``{node: {"mlx5_0 port 1":
    rail_figures}}`` (nodes read both times only)."""
    return {
        node: {
            f"{hca} port {port}": rail_figures(before[node], now, hca, port)
            for hca, port in roce_ports(now)
        }
        for node, now in sorted(after.items())
        if before.get(node) and roce_ports(now)
    }


def _rail_problem(node: str, rail: str, f: dict[str, Any]) -> str | None:
    """Why a RoCE rail fails the stage, or None: flow control not effective, or a counter
    that decides it not read."""
    counters = "/".join(("out_of_sequence", "local_ack_timeout_err", "roce_adp_retrans"))
    if f["retransmits"] is None:
        return (
            f"RoCE retransmit counters not read on {rail} (hw_counters {counters}, ...): "
            "whether the fabric dropped packets under the bandwidth stage's load is unknown"
        )
    if not f["retransmits"]:
        return None
    grew = ", ".join(f"{name} +{n}" for name, n in sorted(f["grew"].items()))
    where = ", ".join(f["netdevs"]) or "no netdev found in its GID table"
    if f["pause_frames"] is None:
        return (
            f"retransmits grew on {rail} under the bandwidth stage's load ({grew}) and its "
            f"pause counters were not read (ethtool -S of {where}): whether flow control held "
            "is unknown"
        )
    if f["pause_frames"]:
        return None  # congestion, with flow control at work: a figure
    return (
        f"flow control not effective on {node} rail {rail} ({where}): retransmits grew under the "
        f"bandwidth stage's load ({grew}) while no pause frame was sent or received: the fabric "
        "drops RoCE packets; check PFC on the priority NCCL's traffic class lands on "
        "(NCCL_IB_TC, mlnx_qos: trust mode and pfc) on this node and its switch port"
    )


def roce_problems(before: dict[str, Counters], after: dict[str, Counters]) -> list[Problem]:
    """Each node's RoCE rails that fail: flow control not effective, or not read."""
    return [
        Problem("bandwidth", node, cause)
        for node, rails in roce_figures(before, after).items()
        for rail, figures in rails.items()
        if (cause := _rail_problem(node, rail, figures))
    ]


def roce_lines(figures: dict[str, Any]) -> list[str]:
    """The RoCE figures for people, one line per rail."""

    def shown(value: int | None) -> str:
        return "not read" if value is None else f"+{value}"

    return [
        f"RoCE {node} {rail} under load: retransmits {shown(f['retransmits'])}, pause frames "
        f"{shown(f['pause_frames'])}"
        + (" (congestion)" if f["retransmits"] and f["pause_frames"] else "")
        + f", CNPs sent {shown(f['cnp_sent'])}, ECN-marked {shown(f['ecn_marked'])}, CNPs "
        f"handled {shown(f['cnp_handled'])}"
        for node, rails in sorted(figures.items())
        for rail, f in rails.items()
    ]
