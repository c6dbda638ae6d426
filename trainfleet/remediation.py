"""Opt-in remediation of one node (deploy/remediate.py), decided as plain data: which PCIe
switch ports get ACS's redirects turned off at every boot, which GPUs are reset and why, in
which order the GPU's users are stopped and started around the reset, and what is refused.

Reads the same plain data the hardware check judges (``trainfleet.hw.sources.read_hardware``)
and what the remediation fact saw of the node's services (facts/remediation_facts.py). Every
value that reaches a shell or a file passes a grammar here first (a PCI address, a unit name).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from types import MappingProxyType
from typing import Any

from trainfleet.defaults import ACS_UNIT, FABRIC_MANAGER, GPU_USERS, SETPCI, UNITS
from trainfleet.hw import lspci
from trainfleet.hw.sources import LSPCI, SMI_XML
from trainfleet.render import render

ACS_TEMPLATE = "remediation/trainfleet-acs.service.j2"  # the boot unit, rendered here

# lspci -vvv's address (always with its domain, as trainfleet.hw.lspci gives it) and
# nvidia-smi's (eight hex digits of domain): nothing else reaches setpci or nvidia-smi -i.
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
GPU_BUS = re.compile(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")

# The ACS Control register (ACS capability + 6; PCIe base spec): bit 0 Source Validation,
# 2 P2P Request Redirect, 3 P2P Completion Redirect, the bits lspci prints as SrcValid, ReqRedir
# and CmpltRedir and the hardware check judges (lspci.ACS_REDIRECTS). Only these are cleared
# (setpci's VALUE:MASK): whatever else the firmware set stays as it was.
ACS_BITS = MappingProxyType({"SrcValid": 0x1, "ReqRedir": 0x4, "CmpltRedir": 0x8})
ACS_MASK = f"{sum(ACS_BITS[name] for name in lspci.ACS_REDIRECTS):04x}"
# An ExecStart line of the unit, this release's (setpci by its absolute path, behind the
# vfio-pci test) or an earlier one's (setpci by its bare name): the bridge it clears.
_UNIT_LINE = re.compile(
    r"ExecStart=.*\bsetpci -s (\S+) ECAP_ACS\+0x6\.w=0000:" + ACS_MASK + r"\b.*"
)
# A device passed through to a virtual machine: its config space is the guest's, not ours.
VFIO = "vfio-pci"

# The driver's own words that ask for a reset (nvidia-smi -q -x); a recovery action of
# "Reset" (R570+ drivers). Anything else the GPU asks for is not a reset's to fix.
RESET_ASKS = (
    ("row_remap_pending", "row remap pending"),
    ("retirement_pending", "page retirement pending"),
    ("reset_required", "reset required"),
)
RESET_ACTIONS = ("Reset",)
NOT_A_RESET = (("row_remap_failure", "row remap failed (the GPU needs replacing)"),)


@dataclass(frozen=True)
class AcsPlan:
    """The boot unit's bridges and why: ``found`` are the check's findings now (``bridge above
    device: bits``); ``bridges`` adds those the unit already lists that are still ACS-capable
    switch ports above a GPU or NIC, so a converged node plans the same unit again."""

    bridges: tuple[str, ...] = ()
    found: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()  # the ACS could not be judged: the node fails, named
    skipped: str = ""  # nothing of this node's to change (a virtual machine)
    setpci: str = ""  # its absolute path on the node (SETPCI), for the unit
    left: tuple[str, ...] = ()  # ports bound to vfio-pci: a guest's, left alone
    unit: str | None = None  # the boot unit for ``bridges`` (``acs_unit_text``); None: none


@dataclass(frozen=True)
class GpuReset:
    bus: str  # nvidia-smi's PCI address, 00000000:18:00.0
    reasons: tuple[str, ...]  # the driver's words


@dataclass(frozen=True)
class ResetNeed:
    """The GPUs that ask for a reset, and whether they must all be reset in one command (an
    NVSwitch system: its fabric manager is stopped for the reset)."""

    gpus: tuple[GpuReset, ...] = ()
    every_gpu: bool = False
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class ResetPlan:
    """The ordered steps of one reset, or why it is refused."""

    stops: tuple[str, ...] = ()
    resets: tuple[str, ...] = ()  # the nvidia-smi -r commands, for people
    starts: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()

    @property
    def steps(self) -> list[str]:
        return (
            [f"stop {u}" for u in self.stops]
            + list(self.resets)
            + [f"start {u}" for u in self.starts]
            + [f"check {c}" for c in self.checks]
        )


@dataclass(frozen=True)
class Check:
    """One verified step after the remediation: what, whether it holds, what was seen."""

    step: str
    ok: bool
    seen: str = field(default="")

    def __str__(self) -> str:
        return f"{'pass' if self.ok else 'FAIL'}: {self.step}" + (
            f" ({self.seen})" if self.seen else ""
        )


# ---- grammar ---------------------------------------------------------------------------------


def bad_bdfs(values: Iterable[str]) -> list[str]:
    return [v for v in values if not (isinstance(v, str) and BDF.fullmatch(v))]


def bad_gpu_buses(values: Iterable[str]) -> list[str]:
    return [v for v in values if not (isinstance(v, str) and GPU_BUS.fullmatch(v))]


def bad_units(values: Iterable[str]) -> list[str]:
    return [v for v in values if v not in UNITS]


# ---- ACS -------------------------------------------------------------------------------------


def unit_bridges(text: str | None) -> list[str]:
    """The bridges trainfleet's own ACS unit lists (the template's ExecStart lines)."""
    found = (_UNIT_LINE.fullmatch(line.strip()) for line in (text or "").splitlines())
    return [m.group(1) for m in found if m and BDF.fullmatch(m.group(1))]


def acs_plan(
    hw: Mapping[str, Any] | None, unit_text: str | None, virtual: bool, setpci: str | None
) -> AcsPlan:
    """Which switch ports the ACS unit clears at boot: those the hardware check finds now,
    plus those the unit already lists that are still ACS-capable ports above a GPU or NIC (a
    port the unit fixed reads clean now; dropping it would undo the fix at the next boot).
    A port bound to vfio-pci is left alone (named); ``setpci`` is the path the remediation fact
    found (one of SETPCI), and none is a problem where a port is to be cleared."""
    if virtual:  # trainfleet.capabilities.hardware.virtual: the check judges no ACS there
        return AcsPlan(skipped="a virtual machine: its PCIe ACS is the hypervisor's")
    if hw is not None and hw["status"].get(LSPCI) == "skipped":
        return AcsPlan(skipped="no GPU and no HCA on this node")
    if hw is None or hw["pci"] is None:
        why = (hw or {}).get("problems", {}).get(LSPCI, "not read")
        return AcsPlan(problems=(f"lspci -vvv unreadable ({why}): ACS left alone",))
    if any(d["denied"] for d in hw["pci"]):
        return AcsPlan(problems=("lspci could not read capabilities (not root): ACS left alone",))
    above: dict[str, list[dict[str, Any]]] = {}  # each port -> the GPUs and NICs below it
    for bridge, device in lspci.switch_ports_above(hw["pci"]):
        above.setdefault(bridge["address"], []).append(device)
    by_address = {d["address"]: d for d in hw["pci"]}
    guests = {a for a in above if by_address[a].get("driver") == VFIO}
    found, bridges = [], set()
    for address, devices in sorted(above.items()):
        bits = lspci.acs_enabled(by_address[address])
        if bits and address not in guests:
            bridges.add(address)
            found += [f"{address} above {d['address']}: {' '.join(bits)}" for d in devices]
    kept = [b for b in unit_bridges(unit_text) if b in above and by_address[b]["acs"] is not None]
    bridges.update(b for b in kept if b not in guests)
    left = tuple(
        f"{a} is bound to {VFIO} (a virtual machine's): left alone" for a in sorted(guests)
    )
    if bad := bad_bdfs(sorted(bridges)):  # never reaches the unit: the node fails, named
        return AcsPlan(found=tuple(found), left=left, problems=(f"not PCI addresses: {bad!r}",))
    if bridges and setpci not in SETPCI:
        where = ", ".join(SETPCI)
        return AcsPlan(
            found=tuple(found),
            left=left,
            problems=(
                f"setpci not found as root's own file at {where} (pciutils): ACS left alone",
            ),
        )
    return AcsPlan(
        bridges=tuple(sorted(bridges)),
        found=tuple(found),
        setpci=(setpci or "") if bridges else "",
        left=left,
        unit=acs_unit_text(sorted(bridges), setpci or "") if bridges else None,
    )


def acs_unit_text(bridges: list[str], setpci: str) -> str:
    """The boot unit (templates/remediation/): one setpci per bridge clearing the redirect bits,
    by its absolute path, unless the bridge is bound to vfio-pci at boot; ValueError for an
    address outside the grammar or a setpci path not one of SETPCI, so nothing else reaches
    the file."""
    chosen = sorted(set(bridges))
    if bad := bad_bdfs(chosen):
        raise ValueError(f"not PCI addresses: {bad!r}")
    if not chosen:
        raise ValueError("no bridge to clear ACS on")
    if setpci not in SETPCI:
        raise ValueError(f"setpci at {setpci[:80]!r}: not one of {', '.join(SETPCI)}")
    return render(ACS_TEMPLATE, bridges=chosen, mask=ACS_MASK, setpci=setpci)


# ---- GPU reset -------------------------------------------------------------------------------


def _nvswitch(hw: Mapping[str, Any]) -> bool:
    """An NVSwitch system: NVIDIA bridges on the PCI bus, or a GPU on an NVLink fabric."""
    bridges = any(d["class"] == "Bridge" and "NVIDIA" in d["name"] for d in hw["pci"] or [])
    fabric = any(
        g["fabric"] and g["fabric"]["state"] not in (None, "N/A") for g in hw["gpus"] or []
    )
    return bridges or fabric


def gpu_resets(hw: Mapping[str, Any] | None) -> ResetNeed:
    """The GPUs whose driver asks for a reset, in its own words; a GPU that needs more than a
    reset (a reboot, a replacement) or an unreadable nvidia-smi refuses every reset."""
    if hw is not None and hw["status"].get(SMI_XML) == "absent":
        return ResetNeed()  # no nvidia-smi: no NVIDIA GPU to reset
    if hw is None or hw["gpus"] is None:
        why = (hw or {}).get("problems", {}).get(SMI_XML, "not read")
        return ResetNeed(problems=(f"nvidia-smi -q -x unreadable ({why}): no GPU reset",))
    gpus, problems = [], []
    for g in hw["gpus"]:
        reasons = [words for key, words in RESET_ASKS if g[key]]
        action = g["recovery_action"]
        if action in RESET_ACTIONS:
            reasons.append(f"recovery action {action}")
        elif action not in (None, "None", "N/A"):
            problems.append(f"GPU {g['bus']}: recovery action {action}, not a reset")
        problems += [f"GPU {g['bus']}: {words}" for key, words in NOT_A_RESET if g[key]]
        if reasons:
            gpus.append(GpuReset(bus=g["bus"], reasons=tuple(reasons)))
    if bad := bad_gpu_buses(g.bus for g in gpus):
        problems.append(f"GPU addresses outside nvidia-smi's form: {bad!r}")
    if problems:
        return ResetNeed(problems=tuple(problems))
    return ResetNeed(gpus=tuple(gpus), every_gpu=bool(gpus) and _nvswitch(hw))


def _active(units: Mapping[str, Mapping[str, str]], name: str) -> bool:
    return (units.get(name) or {}).get("active") == "active"


def reset_plan(need: ResetNeed, state: Mapping[str, Any]) -> ResetPlan:
    """The reset's steps from what ``state`` (the remediation fact) saw: the GPU's users that
    run, stopped in order; the reset; those users started in reverse; the checks. Refused, with
    nothing stopped, where a GPU process runs (named by pid), where its processes could not be
    listed, without systemd, or on an NVSwitch system whose fabric manager is not running (the
    fabric is not rebuilt after the reset without it)."""
    if need.problems or not need.gpus:
        return ResetPlan(refusals=need.problems)
    refusals = []
    if state["gpu_pids"]:
        pids = ", ".join(str(p) for p in state["gpu_pids"][:16])
        refusals.append(f"GPU processes running (pids {pids}): no reset under a job")
    if state["gpu_pids_unknown"]:
        refusals.append("the GPU processes could not be listed: a job cannot be ruled out")
    if not state["systemd"]:
        refusals.append("systemd is not running: the GPU's users cannot be stopped and started")
    units = state["units"]
    if need.every_gpu and not _active(units, FABRIC_MANAGER):
        refusals.append(
            f"{FABRIC_MANAGER} is not running on this NVSwitch system: converge it first "
            "(deploy/cluster.py), the fabric needs it after the reset"
        )
    if refusals:
        return ResetPlan(refusals=tuple(refusals))
    stops = tuple(u for u in GPU_USERS if _active(units, u))
    resets = (
        ("nvidia-smi -r (every GPU: NVLink peers together while the fabric manager is stopped)",)
        if need.every_gpu
        else tuple(f"nvidia-smi -r -i {g.bus}" for g in need.gpus)
    )
    checks = ["nvidia-smi -q -x: no GPU asks for a reset"]
    if need.every_gpu:
        checks.append("nvidia-smi -q -x: every GPU's fabric Completed/Success")
    return ResetPlan(stops=stops, resets=resets, starts=stops[::-1], checks=tuple(checks))


# ---- verification after ----------------------------------------------------------------------


def verify(
    hw: Mapping[str, Any] | None,
    state: Mapping[str, Any],
    bridges: Iterable[str],
    gpus: Iterable[str],
    every_gpu: bool,
    started: Iterable[str],
) -> list[Check]:
    """Each remediated part read again: the ACS bits of each bridge, the unit enabled and
    active; each reset GPU asks for nothing, the fabric is built; the users running again."""
    checks: list[Check] = []
    units = state["units"]
    bridges = list(bridges)
    if bridges:
        pci = {d["address"]: d for d in (hw or {}).get("pci") or []}
        for b in bridges:
            bits = lspci.acs_enabled(pci[b]) if b in pci else None
            seen = "not read" if bits is None else (" ".join(bits) or "off")
            checks.append(Check(f"ACS redirects off on {b}", bits == [], seen))
        unit = units.get(ACS_UNIT) or {}
        checks.append(
            Check(
                f"{ACS_UNIT}.service enabled and active",
                unit.get("enabled") == "enabled" and unit.get("active") == "active",
                f"{unit.get('enabled', 'none')}, {unit.get('active', 'none')}",
            )
        )
    gpus = list(gpus)
    if gpus:
        read = {g["bus"]: g for g in (hw or {}).get("gpus") or []}
        for bus in gpus:
            g = read.get(bus)
            if g is None:
                checks.append(Check(f"GPU {bus} asks for no reset", False, "not read"))
                continue
            still = [w for k, w in RESET_ASKS if g[k]]
            if g["recovery_action"] not in (None, "None", "N/A"):
                still.append(f"recovery action {g['recovery_action']}")
            checks.append(Check(f"GPU {bus} asks for no reset", not still, ", ".join(still)))
        if every_gpu:
            for g in (hw or {}).get("gpus") or []:
                fabric = g["fabric"] or {}
                seen = f"{fabric.get('state')}/{fabric.get('status')}"
                ok = fabric.get("state") == "Completed" and fabric.get("status") == "Success"
                checks.append(Check(f"GPU {g['bus']} fabric Completed/Success", ok, seen))
        for u in started:
            checks.append(Check(f"{u} active again", _active(units, u)))
    return checks


# ---- the entry point's input and report -------------------------------------------------------


def target_problem(value: Any, names: list[str], in_run: list[str]) -> str | None:
    """Why ``value`` (``--data trainfleet_remediate=...``) does not name exactly one node of the
    spec that this run reaches; None when it does."""
    if value is None or value == "":
        return "name the one node to remediate: --data trainfleet_remediate=<node>"
    if not isinstance(value, str):
        return f"{str(value)[:40]!r} is not a node name"
    parts = [p for p in re.split(r"[\s,]+", value) if p]
    if len(parts) != 1:
        return f"exactly one node, one at a time (got {len(parts)}: {value[:80]!r})"
    if value not in names:
        near = get_close_matches(value, names, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return f"{value[:64]!r} is not a node of the spec{hint}"
    if value not in in_run:
        return f"{value!r} is not in this run (left out by --limit?)"
    return None


def summary(node: str, acs: AcsPlan, need: ResetNeed, reset: ResetPlan) -> list[str]:
    """What the remediation will do on ``node``, for people, before it runs."""
    lines = [f"ACS found: {f}" for f in acs.found]
    if acs.bridges:
        lines.append(f"ACS boot unit clears the redirects on: {', '.join(acs.bridges)}")
    lines += [f"ACS: {p}" for p in acs.problems] + ([f"ACS: {acs.skipped}"] if acs.skipped else [])
    lines += [f"ACS: {line}" for line in acs.left]
    lines += [f"GPU {g.bus} asks for a reset: {', '.join(g.reasons)}" for g in need.gpus]
    lines += [f"GPU reset refused: {r}" for r in reset.refusals]
    if need.gpus and not reset.refusals:
        lines.append("GPU reset steps: " + "; ".join(reset.steps))
    if not (acs.bridges or acs.problems or need.gpus or reset.refusals):
        lines.append(
            f"nothing needs doing on {node}: no ACS redirect above a GPU or NIC, "
            "no GPU asks for a reset"
        )
    return lines
