"""Error counters under trainfleet's own load: each InfiniBand port's error counters, each GPU's
PCIe replay counter and each NVLink's error counters read before and after the preflight's
bandwidth stage; a port, GPU or link whose errors grew while the stage drove traffic through it
is named (symbol errors, link downs and recoveries, receive errors, PCIe replays, NVLink replay,
recovery and CRC errors: a link that flaps or degrades under load passes an idle check). Plain
functions."""

from __future__ import annotations

import base64
import binascii
import re

from checks.preflight_report import Problem
from trainfleet.hw import nvlink, smi_xml
from trainfleet.hw.infiniband import ERROR_COUNTERS
from trainfleet.text import printable

_LINE = re.compile(r"ib ([A-Za-z0-9_]{1,32}) ([0-9]{1,3}) ([A-Za-z0-9_]{1,64}) ([0-9]{1,20})")
Counters = dict[tuple[str, str, str], int]  # (HCA, port, counter) -> value


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
            if key in before.get(node, {}) and value > before[node][key]
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
    return problems
