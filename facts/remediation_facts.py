"""Fact of what deploy/remediate.py needs beside the hardware fact (HardwareState): the GPU
processes, the services that hold the GPUs, and trainfleet's ACS boot unit."""

from __future__ import annotations

import base64
import binascii
from typing import TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.gpu_node_facts import SMI_TIMEOUT
from facts.shell import script, shell
from facts.stack_facts import GPU_PIDS
from trainfleet.defaults import ACS_UNIT_PATH, SETPCI, UNITS

_SCRIPT = GPU_PIDS + script("remediation.sh")
_STATES = frozenset("abcdefghijklmnopqrstuvwxyz-")  # systemctl's words: enabled, not-found, ...


class UnitT(TypedDict):
    enabled: str  # is-enabled: "enabled" | "disabled" | "static" | "masked" | "none" (no unit)
    active: str  # is-active: "active" | "inactive" | "failed" | ... | "none"


class RemediationStateT(TypedDict):
    gpu_pids: list[int]  # nvidia-smi --query-compute-apps=pid
    gpu_pids_unknown: bool  # that probe failed or printed a non-pid line: a job not ruled out
    systemd: bool
    units: dict[str, UnitT]  # trainfleet.defaults.UNITS
    acs_unit: str | None  # ACS_UNIT_PATH's content; None: absent
    setpci: str | None  # the first of SETPCI that is root's own executable; None: none is


def _word(value: str) -> str:
    return value if value and set(value) <= _STATES else "unknown"


class RemediationState(FactBase[RemediationStateT]):
    """
    The GPU processes (their pids), systemd, the state of each unit the remediation stops,
    starts or writes (nvidia-persistenced, nvidia-dcgm, dcgm, nvidia-fabricmanager,
    trainfleet-acs), trainfleet's ACS unit file and where setpci is (the first of
    trainfleet.defaults.SETPCI that is a root-owned executable no one else can write), in
    one command. A probe that failed reads as
    ``gpu_pids_unknown`` (so does one that printed a line that is not a pid: ``[N/A]``,
    ``[Insufficient Permissions]``, an error message), a missing systemd as ``systemd: False``:
    never as passing.

    + timeout: seconds nvidia-smi may take
    + root: prefix of the setpci paths looked at ("" on nodes; tests point it at a tree)

    .. code:: python

        {"gpu_pids": [830], "gpu_pids_unknown": False, "systemd": True,
         "units": {"nvidia-persistenced": {"enabled": "enabled", "active": "active"}, ...},
         "acs_unit": None, "setpci": "/usr/bin/setpci"}
    """

    def command(self, timeout: int = SMI_TIMEOUT, root: str = "") -> StringCommand:
        return shell(_SCRIPT, int(timeout), ACS_UNIT_PATH, " ".join(UNITS), root, *SETPCI)

    def process(self, output: list[str]) -> RemediationStateT:
        state = RemediationState.default()
        state["gpu_pids_unknown"] = False  # until the probe says it failed
        pids: set[int] = set()
        for line in output:
            tag, _, rest = line.partition(" ")
            if tag == "gpu_pid":
                if rest.isascii() and rest.isdigit() and len(rest) <= 10:
                    pids.add(int(rest))
                else:  # not a pid: what the probe saw cannot be read, a job not ruled out
                    state["gpu_pids_unknown"] = True
            elif tag == "gpu_pids" and rest == "unknown":
                state["gpu_pids_unknown"] = True
            elif tag == "systemd":
                state["systemd"] = rest.strip() == "yes"
            elif tag == "unit":
                name, enabled, active = (rest.split() + ["none", "none"])[:3]
                if name in UNITS:  # only the units asked for: nothing else names one
                    state["units"][name] = {"enabled": _word(enabled), "active": _word(active)}
            elif tag == "setpci" and rest in SETPCI:  # only a path asked for names one
                state["setpci"] = state["setpci"] or rest
            elif tag == "acs_unit":
                try:
                    data = base64.b64decode(rest.strip(), validate=True)
                except binascii.Error as exc:
                    raise ValueError(f"{ACS_UNIT_PATH}: not base64 ({exc})") from exc
                state["acs_unit"] = data.decode("utf-8", "replace")
        state["gpu_pids"] = sorted(pids)
        return state

    @staticmethod
    def default() -> RemediationStateT:
        """Nothing read: no systemd, the GPU processes unknown (a reset is refused)."""
        return {
            "gpu_pids": [],
            "gpu_pids_unknown": True,
            "systemd": False,
            "units": {},
            "acs_unit": None,
            "setpci": None,
        }
