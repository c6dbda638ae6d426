"""The kernel log since boot (``dmesg``): NVIDIA Xid and NVSwitch SXid events, GPUs fallen off
the bus, and whether the kernel runs under a hypervisor.

A kernel line is matched from its start (after dmesg's ``[seconds]`` stamp): a process name the
kernel prints at the start of a line (``NAME[PID]: segfault at ...``) is at most 15 characters,
too short to pass for ``NVRM: Xid (PCI:...): N,``, and anything a user's text puts later in a
line is not its start. This holds for util-linux's dmesg, which indents the continuation lines
of a record that holds a newline; busybox's stamps each line, so there a file name with a
newline in a logged message could start a line. The log reaches back to its oldest record the
kernel's ring buffer still holds, not always to boot.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

from trainfleet.hw.sxid_catalogue import SXID_CATALOGUE
from trainfleet.hw.sxid_catalogue import WARNING as SXID_WARNING

# What each Xid means and what it asks for, after NVIDIA's Xid catalogue
# (docs.nvidia.com/deploy/xid-errors) and the classifications of leptonai/gpud
# (components/accelerator/nvidia/xid) and Azure/azurehpc-health-checks (check_xid.sh).
# "application": the job's own fault (a bug, an illegal address); the GPU is fine and the node
# stays in. Everything else is the hardware's or the driver's: the node is named.
XID_CATALOGUE: MappingProxyType[int, tuple[str, str]] = MappingProxyType(
    {
        13: ("graphics engine exception", "application"),
        31: ("GPU memory page fault", "application"),
        43: ("GPU stopped processing", "application"),
        45: ("preemptive cleanup after earlier errors", "application"),
        48: ("double-bit ECC error", "reset the GPU"),
        61: ("internal micro-controller breakpoint/warning", "reset the GPU"),
        62: ("internal micro-controller halt", "reset the GPU"),
        63: ("ECC page retirement or row remapping recorded", "reset the GPU to apply"),
        64: ("ECC page retirement or row remapping failed", "replace the GPU"),
        74: ("NVLink error", "reset the GPU; check the NVLink"),
        79: ("GPU has fallen off the bus", "reboot; check PCIe, power, the GPU"),
        92: ("high single-bit ECC error rate", "watch; replace the GPU if it persists"),
        94: ("contained ECC error", "restart the job; reset the GPU"),
        95: ("uncontained ECC error", "reset the GPU"),
        119: ("GSP RPC timeout", "reset the GPU"),
        120: ("GSP error", "reset the GPU"),
        121: ("C2C link error", "reset the GPU"),
        140: ("unrecovered ECC error", "reset the GPU"),
        154: ("GPU recovery action changed", "do what nvidia-smi -q says (reset or reboot)"),
    }
)
APPLICATION = "application"

# dmesg's stamps: "[  12.345678]", "-T"'s "[Sun Feb 23 16:24:18 2025]", "--time-format iso"'s
# "2024-11-15T12:02:03,470068+00:00 "
_STAMP = re.compile(r"\A(?:\[[^\]]{1,40}\] ?|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:,.+-]{8,40} )")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]{7,16})\): ([0-9]{1,4})\b")
_SXID = re.compile(
    r"nvidia-nvswitch[0-9]*: SXid \(PCI:([0-9A-Fa-f:.]{7,16})\): ([0-9]{1,5}), (.{0,200})"
)
# An SXid event is three lines: its description ("Fatal, Link 48 LTSSM Fault Up", the driver's
# own verdict first), its Data and its Severity; the event is counted on the first, whose link
# is the slot. An SXid seen only in Data or Severity lines (its description rate-limited or
# pushed out of the log) is still one event, of no known link.
_SXID_DETAIL = re.compile(r"Data \{|Severity [0-9]")
_SXID_LINK = re.compile(r"\ALink ([0-9]{1,3})\b")
_FALLEN = re.compile(
    r"NVRM: GPU (?:at PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?):? "
    r"GPU has fallen off the bus"
)
# The driver's multi-line form (one record): "NVRM: The NVIDIA GPU 0000:5d:00.0" then "(PCI ID:
# 10de:2330) installed in this system has" and "fallen off the bus and is not responding to
# commands.", printed when a probe finds the GPU gone.
_GONE_GPU = re.compile(
    r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$"
)
_GONE_TAIL = re.compile(r"\s*NVRM: fallen off the bus and is not responding")
_HYPERVISOR = re.compile(r"Hypervisor detected: ([A-Za-z0-9 _-]{1,40})$")

# The lines the parser reads (``grep -E``): drift's live read keeps only these, the rest of a
# long log never leaves the node; a capture keeps the whole log.
# Anchored at a line's start (after its stamp), as the parser reads it: a line a user's text can
# reach mid-way (an audit record's name="...") is not kept, so it cannot crowd the real ones out
# of the last 2000 lines drift reads.
GREP = (
    r"^(\[[^]]{1,40}\] ?|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:,.+-]{8,40} )?"
    r"(NVRM: (Xid|GPU |The NVIDIA GPU)|nvidia-nvswitch[0-9]*: SXid|Hypervisor detected)"
    r"|^[[:space:]]+NVRM: fallen off the bus"
)


def read(log: str) -> dict[str, Any]:
    """``{"xids": [{"pci", "xid"}], "sxids": [{"pci", "xid", "link", "fatal"}], "fallen": [pci],
    "hypervisor": str|None}`` in the log's order; an SXid's ``fatal``: what the driver printed
    (True for "Fatal", False for "Non-fatal", None when it printed neither)."""
    xids: list[dict[str, Any]] = []
    sxids: list[dict[str, Any]] = []
    fallen: list[Any] = []
    hypervisor = None
    described: set[Any] = set()
    detailed: dict[Any, Any] = {}  # the SXids seen with a description line, and without
    gone, gone_lines = None, 0  # an "NVRM: The NVIDIA GPU ..." record's GPU, for 2 more lines
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        message = line[stamp.end() :] if stamp else line
        if gone and _GONE_TAIL.match(message):
            fallen.append(gone)
            gone = None
            continue
        gone_lines -= 1
        if gone_lines <= 0:
            gone = None
        if not stamp and line[:1].isspace():  # a record's continuation line, never its start
            continue
        if found := _XID.match(message):
            xids.append({"pci": found.group(1).lower(), "xid": int(found.group(2))})
        elif found := _SXID.match(message):
            key = (found.group(1).lower(), int(found.group(2)))
            text = found.group(3)
            if _SXID_DETAIL.match(text):
                detailed.setdefault(key, len(sxids))
                continue
            verdict, _, what = text.partition(", ")
            link = _SXID_LINK.match(what)
            described.add(key)
            sxids.append(
                {
                    "pci": key[0],
                    "xid": key[1],
                    "link": int(link.group(1)) if link else None,
                    "fatal": {"Fatal": True, "Non-fatal": False}.get(verdict),
                }
            )
        elif found := _FALLEN.match(message):
            fallen.append(found.group(1).lower())
        elif found := _GONE_GPU.match(message):
            gone, gone_lines = found.group(1).lower(), 3
        elif found := _HYPERVISOR.match(message):
            hypervisor = found.group(1).strip()
    for (pci, xid), at in sorted(detailed.items(), key=lambda kv: kv[1], reverse=True):
        if (pci, xid) not in described:
            sxids.insert(at, {"pci": pci, "xid": xid, "link": None, "fatal": None})
    return {"xids": xids, "sxids": sxids, "fallen": fallen, "hypervisor": hypervisor}


def xid_name(xid: int) -> str:
    meaning = XID_CATALOGUE.get(xid)
    return f"Xid {xid} ({meaning[0]})" if meaning else f"Xid {xid} (not in the catalogue)"


def sxid_name(sxid: int) -> str:
    meaning = SXID_CATALOGUE.get(sxid)
    return f"SXid {sxid} ({meaning[0]})" if meaning else f"SXid {sxid} (not in the catalogue)"


def hardware_sxids(sxids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The SXids the fabric does not survive: the ones the driver printed as Fatal, the
    catalogue's fatal ones and unknown ones."""
    return [
        x
        for x in sxids
        if x.get("fatal") or SXID_CATALOGUE.get(x["xid"], ("", ""))[1] != SXID_WARNING
    ]


def hardware_xids(xids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The Xids that are not the application's (unknown ones included: a check that cannot
    classify an event names it)."""
    return [x for x in xids if XID_CATALOGUE.get(x["xid"], ("", ""))[1] != APPLICATION]
