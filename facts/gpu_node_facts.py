"""Fact of a GPU node's settings: driver, persistence mode, NVSwitch fabric and its manager,
nvidia_peermem, the locked-memory limit a session gets, and clock synchronisation."""

from __future__ import annotations

import base64
import binascii
import re
from types import MappingProxyType
from typing import Any, TypedDict
from xml.sax.saxutils import escape

from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import FILE_FN, file_line, file_text, read_file_lines
from facts.shell import script, shell
from facts.stack_facts import lock_name
from trainfleet.hw.smi_xml import smi_root, text
from trainfleet.text import printable

MEMLOCK_CONF = "/etc/security/limits.d/90-trainfleet-memlock.conf"
PEERMEM_CONF = "/etc/modules-load.d/trainfleet-peermem.conf"
SMI_TIMEOUT = 20  # seconds: nvidia-smi hangs on a wedged GPU; the run must not

# Every line a tool prints is prefixed with that tool's tag (sed/awk), so no tool's output can
# pass for another's; the trainfleet files travel as ``file`` lines (one base64 line each).
# $1 is the root the node's files are read under ("" on nodes; a fixture tree in tests).
# A missing tool or file prints its own "absent" line or nothing: never a passing value.
_SCRIPT = FILE_FN + script("gpu_node.sh")

_SYSTEM_TIME = re.compile(r"([0-9.]+) seconds (fast|slow) of NTP time")
_TIMESYNC_OFFSET = re.compile(r"([+-]?[0-9.]+)(us|ms|s|min)$")
_SCALE = MappingProxyType({"us": 0.001, "ms": 1.0, "s": 1000.0, "min": 60000.0})


class GpuT(TypedDict):
    bus: str  # "00000000:18:00.0"
    persistence: str | None  # "Enabled" | "Disabled" | None (not printed)
    fabric_state: str | None  # "Completed" | "In Progress" | "N/A" | None (no Fabric section)
    fabric_status: str | None


class UnitT(TypedDict):
    enabled: str  # is-enabled: "enabled" | "disabled" | "masked" | "none" (no such unit)
    active: str  # is-active: "active" | "inactive" | "failed" | ...


class ClockT(TypedDict):
    chrony: bool  # chronyc tracking answered
    offset_ms: float | None  # chrony's System time (+: fast) or timesyncd's Offset; None: unread
    leap: str | None  # chrony's Leap status ("Normal", "Not synchronised")
    ntp_synchronized: str | None  # timedatectl's NTPSynchronized: "yes" | "no" | None


class GpuNodeStateT(TypedDict):
    # "ok" | "absent" (no nvidia-smi) | "failed (exit N)" (124: timed out) | "refused: WHY"
    smi: str
    driver: str | None
    gpus: list[GpuT]
    nvswitches: list[str]  # PCI addresses of NVIDIA bridges (NVSwitches)
    systemd: bool  # systemd is PID 1 (/run/systemd/system)
    units: dict[str, UnitT]
    fabricmanager: dict[str, str]  # installed nvidia-fabricmanager* package -> version
    fabricmanager_held: list[str]
    peermem_loaded: bool
    peermem_boot: list[str]  # the files that load nvidia_peermem at boot
    memlock: str | None  # soft `ulimit -l` of this non-login session: "unlimited" | KiB
    memlock_hard: str | None
    memlock_conf: str | None  # MEMLOCK_CONF's content
    memlock_other: list[
        str
    ]  # memlock lines of other limits files: "FILE: DOMAIN TYPE memlock VALUE"
    peermem_conf: str | None  # PEERMEM_CONF's content
    clock: ClockT
    nvidia_version: str | None  # /proc/driver/nvidia/version's first line; None: not read
    kernel: str | None  # the kernel release (/proc/sys/kernel/osrelease); None: not read


def read_smi_xml(encoded: str) -> tuple[str | None, list[GpuT]]:
    """The driver and each GPU's persistence mode and fabric state from ``nvidia-smi -q -x``
    (base64), each from its own element; raise ValueError for anything else."""
    try:
        data = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64 ({exc})") from exc
    root = smi_root(data)
    gpus: list[GpuT] = [
        {
            "bus": (gpu.get("id") or "").strip(),
            "persistence": text(gpu, "persistence_mode"),
            "fabric_state": text(gpu.find("fabric"), "state"),
            "fabric_status": text(gpu.find("fabric"), "status"),
        }
        for gpu in root.findall("gpu")
    ]
    return text(root, "driver_version"), gpus


class GpuNodeState(FactBase[GpuNodeStateT]):
    """
    A node's GPU settings in one command: ``nvidia-smi -q -x`` (bounded by ``timeout``: driver,
    each GPU's persistence mode and NVSwitch fabric state), NVSwitches on the PCI bus, the
    systemd units (nvidia-persistenced, nvidia-fabricmanager, chrony, systemd-timesyncd), the
    fabric manager package and its hold, nvidia_peermem loaded and configured at boot, the
    NVIDIA kernel module's version line (open or proprietary) and the kernel release
    (GPUDirect RDMA's path), the
    locked-memory limit this non-login session has (``ulimit -l``), ``chronyc tracking`` or
    timesyncd's status, and trainfleet's limits.d and modules-load.d files. Missing tools
    read as absent (``smi: "absent"``, ``systemd: False``, ``offset_ms: None``), never as passing.

    + root: prefix of every file read ("" on nodes; tests point it at fixture trees)
    + timeout: seconds nvidia-smi may take

    .. code:: python

        {"smi": "ok", "driver": "565.57.01",
         "gpus": [{"bus": "00000000:18:00.0", "persistence": "Enabled",
                   "fabric_state": "Completed", "fabric_status": "Success"}],
         "nvswitches": ["0000:05:00.0"], "systemd": True,
         "units": {"nvidia-persistenced": {"enabled": "enabled", "active": "active"}, ...},
         "fabricmanager": {"nvidia-fabricmanager-565": "565.57.01-1"}, "fabricmanager_held": [...],
         "peermem_loaded": True, "peermem_boot": ["/etc/modules-load.d/trainfleet-peermem.conf"],
         "memlock": "unlimited", "memlock_hard": "unlimited", "memlock_conf": "...",
         "peermem_conf": "...", "kernel": "6.8.0-45-generic",
         "nvidia_version": "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.57.01 ...",
         "clock": {"chrony": True, "offset_ms": 0.26, "leap": "Normal", "ntp_synchronized": "yes"}}
    """

    def command(self, root: str = "", timeout: int = SMI_TIMEOUT) -> StringCommand:
        return shell(_SCRIPT, root, int(timeout), MEMLOCK_CONF, PEERMEM_CONF)

    def process(self, output: list[str]) -> GpuNodeStateT:
        state = GpuNodeState.default()
        clock = state["clock"]
        for line in output:
            tag, _, rest = line.partition(" ")
            if tag == "smi_rc":
                state["smi"] = (
                    "absent"
                    if rest == "absent"
                    else "ok"
                    if rest == "0"
                    else f"failed (exit {rest})"
                )
            elif tag == "smi_xml" and state["smi"] == "ok":
                try:
                    state["driver"], state["gpus"] = read_smi_xml(rest)
                except ValueError as exc:  # fails closed: every GPU property reads it as unreadable
                    state["smi"] = f"refused: {exc}"
            elif tag == "nvswitch":
                state["nvswitches"].append(rest.strip())
            elif tag == "systemd":
                state["systemd"] = rest.strip() == "yes"
            elif tag == "unit":
                name, enabled, active = (rest.split() + ["none", "none"])[:3]
                state["units"][name] = {"enabled": enabled, "active": active}
            elif tag == "ntpsync":
                clock["ntp_synchronized"] = None if rest.strip() in ("", "none") else rest.strip()
            elif tag == "timesync":
                key, _, value = rest.strip().partition(":")
                found = _TIMESYNC_OFFSET.match(value.strip())
                if key.strip() == "Offset" and found and clock["offset_ms"] is None:
                    clock["offset_ms"] = float(found.group(1)) * _SCALE[found.group(2)]
            elif tag == "fmpkg":  # "fmpkg hold ok installed nvidia-fabricmanager-550 550.54.15-1"
                want, _ok, status, name, version = (rest.split() + [""] * 5)[:5]
                if status == "installed" and name:
                    state["fabricmanager"][name] = version
                    if want == "hold":
                        state["fabricmanager_held"].append(name)
            elif tag == "fmlock":
                state["fabricmanager_held"].append(lock_name(rest.strip()))
            elif tag == "peermem_loaded":
                state["peermem_loaded"] = rest.strip() == "yes"
            elif tag == "nvversion":
                state["nvidia_version"] = printable(rest.strip(), 200)
            elif tag == "kernel":
                state["kernel"] = printable(rest.strip(), 100)
            elif tag == "peermem_boot":
                state["peermem_boot"].append(rest.strip())
            elif tag == "memlock":
                soft, _, hard = rest.partition(" ")
                state["memlock"], state["memlock_hard"] = soft.strip() or None, hard.strip() or None
            elif tag == "memlock_other":
                state["memlock_other"].append(printable(rest.strip()))
            elif tag == "chrony":
                clock["chrony"] = True
                key, _, value = rest.partition(":")
                if key.strip() == "System time":
                    found = _SYSTEM_TIME.search(value)
                    if found:
                        ms = float(found.group(1)) * 1000.0
                        clock["offset_ms"] = ms if found.group(2) == "fast" else -ms
                elif key.strip() == "Leap status":
                    clock["leap"] = value.strip()
        files = read_file_lines(output)
        state["memlock_conf"] = file_text(files.get("memlock_conf"))
        state["peermem_conf"] = file_text(files.get("peermem_conf"))
        state["fabricmanager_held"] = sorted(set(state["fabricmanager_held"]))
        return state

    @staticmethod
    def default() -> GpuNodeStateT:
        """Nothing read at all: every value absent (a check reading it fails, never passes)."""
        return {
            "smi": "absent",
            "driver": None,
            "gpus": [],
            "nvswitches": [],
            "systemd": False,
            "units": {},
            "fabricmanager": {},
            "fabricmanager_held": [],
            "peermem_loaded": False,
            "peermem_boot": [],
            "memlock": None,
            "memlock_hard": None,
            "memlock_conf": None,
            "memlock_other": [],
            "peermem_conf": None,
            "clock": {"chrony": False, "offset_ms": None, "leap": None, "ntp_synchronized": None},
            "nvidia_version": None,
            "kernel": None,
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the script prints on the node ``recorded`` holds once its settings are
        ``value``'s (each key ``value`` leaves out is the recorded one): the recorded lines of
        each tool whose part is unchanged, the others printed from the value as that tool's
        lines are (nvidia-smi's document holding only the elements this fact reads)."""
        old: dict[str, Any] = dict(self.process(recorded))
        new = {**old, **value}
        lines: list[str] = []
        for keys, tags, render in _ANSWER_PARTS:
            if all(old[key] == new[key] for key in keys):
                lines += [line for line in recorded if line.partition(" ")[0] in tags]
            else:
                lines += render(new)
        return lines


def _smi_lines(state: dict[str, Any]) -> list[str]:
    smi = state["smi"]
    if smi == "absent":
        return ["smi_rc absent"]
    if smi != "ok":
        found = re.fullmatch(r"failed \(exit ([0-9]+)\)", smi)
        if found is None:
            raise ValueError(f"smi {smi!r}: no output of nvidia-smi reads as it")
        return [f"smi_rc {found.group(1)}", "smi_xml "]
    gpus = "".join(_gpu_xml(gpu) for gpu in state["gpus"])
    document = (
        '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
        f"<nvidia_smi_log>{_element('driver_version', state['driver'])}"
        f"<attached_gpus>{len(state['gpus'])}</attached_gpus>{gpus}</nvidia_smi_log>\n"
    )
    return ["smi_rc 0", "smi_xml " + base64.b64encode(document.encode()).decode()]


def _element(tag: str, value: str | None) -> str:
    return "" if value is None else f"<{tag}>{escape(value)}</{tag}>"


def _gpu_xml(gpu: GpuT) -> str:
    fabric = gpu.get("fabric_state"), gpu.get("fabric_status")
    inner = _element("persistence_mode", gpu.get("persistence"))
    if fabric != (None, None):
        inner += f"<fabric>{_element('state', fabric[0])}{_element('status', fabric[1])}</fabric>"
    return f'<gpu id="{escape(gpu["bus"], {chr(34): "&quot;"})}">{inner}</gpu>'


def _clock_lines(state: dict[str, Any]) -> list[str]:
    clock = state["clock"]
    offset, lines = clock["offset_ms"], []
    if clock["chrony"]:
        lines += [f"chrony Leap status     : {clock['leap']}"] if clock["leap"] else ["chrony"]
        if offset is not None:
            side = "fast" if offset >= 0 else "slow"
            lines.append(
                f"chrony System time     : {abs(offset) / 1000:.9f} seconds {side} of NTP time"
            )
    elif offset is not None:
        lines.append(f"timesync Offset: {offset:f}ms")
    sync = clock["ntp_synchronized"]
    return [f"ntpsync {sync or 'none'}", *lines]


# Each part of the state, the tags that print it and how (GpuNodeState.answer).
_ANSWER_PARTS: tuple[tuple[tuple[str, ...], frozenset[str], Any], ...] = (
    (("smi", "driver", "gpus"), frozenset({"smi_rc", "smi_xml"}), _smi_lines),
    (
        ("nvswitches",),
        frozenset({"nvswitch"}),
        lambda s: [f"nvswitch {a}" for a in s["nvswitches"]],
    ),
    (
        ("systemd",),
        frozenset({"systemd"}),
        lambda s: [f"systemd {'yes' if s['systemd'] else 'no'}"],
    ),
    (
        ("units",),
        frozenset({"unit"}),
        lambda s: [f"unit {n} {u['enabled']} {u['active']}" for n, u in s["units"].items()],
    ),
    (
        ("fabricmanager", "fabricmanager_held"),
        frozenset({"fmpkg", "fmlock"}),
        lambda s: [
            f"fmpkg {'hold' if n in s['fabricmanager_held'] else 'install'} ok installed {n} {v}"
            for n, v in s["fabricmanager"].items()
        ],
    ),
    (
        ("peermem_loaded",),
        frozenset({"peermem_loaded"}),
        lambda s: [f"peermem_loaded {'yes' if s['peermem_loaded'] else 'no'}"],
    ),
    (
        ("peermem_boot",),
        frozenset({"peermem_boot"}),
        lambda s: [f"peermem_boot {f}" for f in s["peermem_boot"]],
    ),
    (
        ("memlock", "memlock_hard"),
        frozenset({"memlock"}),
        lambda s: [f"memlock {s['memlock'] or ''} {s['memlock_hard'] or ''}"],
    ),
    (
        ("memlock_other",),
        frozenset({"memlock_other"}),
        lambda s: [f"memlock_other {x}" for x in s["memlock_other"]],
    ),
    (("clock",), frozenset({"chrony", "ntpsync", "timesync"}), _clock_lines),
    (
        ("nvidia_version",),
        frozenset({"nvversion"}),
        lambda s: [f"nvversion {s['nvidia_version']}"] if s["nvidia_version"] else [],
    ),
    (
        ("kernel",),
        frozenset({"kernel"}),
        lambda s: [f"kernel {s['kernel']}"] if s["kernel"] else [],
    ),
    (
        ("memlock_conf", "peermem_conf"),
        frozenset({"file"}),
        lambda s: [
            file_line("memlock_conf", s["memlock_conf"]),
            file_line("peermem_conf", s["peermem_conf"]),
        ],
    ),
)
