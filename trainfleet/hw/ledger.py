"""The hardware ledger: each node's parts by slot (GPU serial, UUID and VBIOS by PCI address;
HCA firmware and board by device) as drift last saw them, kept on the controller across runs,
so a part that changed is named ("node3 GPU 00000000:18:00.0 serial: A -> B"). Plain functions
over plain data; the file is the run-time's (checks/drift_check.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GONE = "gone"


def parts(hw: Mapping[str, Any] | None) -> dict[str, str]:
    """A node's parts by slot, from its hardware as plain data (trainfleet.hw.sources); what a
    source did not read is left out, never recorded as absent."""
    found: dict[str, str] = {}
    if not hw:
        return found
    for gpu in hw.get("gpus") or []:
        for key, what in (("serial", "serial"), ("uuid", "UUID"), ("vbios", "VBIOS")):
            if gpu.get(key) and gpu[key] != "N/A":
                found[f"GPU {gpu['bus']} {what}"] = gpu[key]
    for name, hca in sorted((hw.get("infiniband") or {}).items()):
        for key, what in (("fw", "firmware"), ("board", "board")):
            if hca.get(key):
                found[f"HCA {name} {what}"] = hca[key]
    return found


def read_now(before: Mapping[str, str], hw: Mapping[str, Any] | None) -> dict[str, str]:
    """A node's parts this run, with the last reading kept for what a failed source could not
    tell (nvidia-smi timed out: its GPUs are not gone)."""
    now = parts(hw)
    problems = (hw or {}).get("problems", {})
    kept = [
        prefix
        for prefix, source in (("GPU ", "nvidia-smi-q.xml"), ("HCA ", "sys-class-infiniband"))
        if hw is None or source in problems
    ]
    return {**{p: v for p, v in before.items() if p.startswith(tuple(kept))}, **now}


def changes(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """What changed between two readings of one node's parts: ``GPU ... serial: A -> B``; a slot
    that emptied or filled since (``gone``) too. A slot whose part was never read is not one."""
    found = []
    for part in sorted(before.keys() | now.keys()):
        old, new = before.get(part, GONE), now.get(part, GONE)
        if old != new:
            found.append(f"{part}: {old} -> {new}")
    return found


def updated(
    ledger: Mapping[str, Mapping[str, str]], seen: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str]]:
    """The ledger after a run: each node read this run as it is now, the others as they were."""
    return {
        **{node: dict(p) for node, p in ledger.items()},
        **{n: dict(p) for n, p in seen.items()},
    }
