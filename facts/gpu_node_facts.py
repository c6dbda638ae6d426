"""Fact of a GPU node's settings: driver, persistence mode, NVSwitch fabric and its manager,
nvidia_peermem, the locked-memory limit a session gets, and clock synchronisation."""

from __future__ import annotations

import base64
import binascii
import re
from types import MappingProxyType
from typing import TypedDict
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring
from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import FILE_FN, file_text, read_file_lines
from facts.shell import shell
from facts.stack_facts import lock_name
from trainfleet.text import printable

MEMLOCK_CONF = "/etc/security/limits.d/90-trainfleet-memlock.conf"
PEERMEM_CONF = "/etc/modules-load.d/trainfleet-peermem.conf"
UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "chrony", "chronyd", "systemd-timesyncd")
SMI_TIMEOUT = 20  # seconds: nvidia-smi hangs on a wedged GPU; the run must not

# Every line a tool prints is prefixed with that tool's tag (sed/awk), so no tool's output can
# pass for another's; the trainfleet files travel as ``file`` lines (one base64 line each).
# $1 is the root the node's files are read under ("" on nodes; a fixture tree in tests).
# A missing tool or file prints its own "absent" line or nothing: never a passing value.
_SCRIPT = (
    FILE_FN
    + r"""
r=$1 t=$2 memlock=$3 peermem=$4
if command -v nvidia-smi >/dev/null 2>&1; then
  # XML, not -q's text: a process name (any user's choice, newlines included) stays inside
  # its own element; the document travels as one base64 line, so it cannot forge a tag.
  x=$(timeout -k 5 "$t" nvidia-smi -q -x 2>/dev/null); echo "smi_rc $?"
  printf 'smi_xml '; printf '%s\n' "$x" | base64 -w0; echo
else
  echo "smi_rc absent"
fi
# NVSwitches are NVIDIA PCI bridges (vendor 0x10de, class 0x0680xx), bound to nvidia-nvswitch.
for d in "$r"/sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] || continue
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
  case $(cat "$d/class" 2>/dev/null) in 0x0680*) echo "nvswitch ${d##*/}" ;; esac
done
if [ -d "$r/run/systemd/system" ] && command -v systemctl >/dev/null 2>&1; then
  echo "systemd yes"
  for u in nvidia-persistenced nvidia-fabricmanager chrony chronyd systemd-timesyncd; do
    e=$(timeout 10 systemctl is-enabled "$u.service" 2>/dev/null | head -n 1)
    a=$(timeout 10 systemctl is-active "$u.service" 2>/dev/null | head -n 1)
    echo "unit $u ${e:-none} ${a:-none}" | tr -d '\r'
  done
  s=$(timeout 10 timedatectl show -p NTPSynchronized --value 2>/dev/null | head -n 1)
  echo "ntpsync ${s:-none}"
  timeout 10 timedatectl timesync-status 2>/dev/null | sed 's/^/timesync /'
else
  echo "systemd no"
fi
if command -v dpkg-query >/dev/null 2>&1; then
  dpkg-query -W -f='fmpkg ${Status} ${Package} ${Version}\n' 'nvidia-fabricmanager*' 2>/dev/null
fi
if command -v rpm >/dev/null 2>&1; then
  rpm -qa --qf 'fmpkg install ok installed %{NAME} %{VERSION}-%{RELEASE}\n' 'nvidia-fabric*manager*' 2>/dev/null
  for f in "$r"/etc/dnf/plugins/versionlock.list "$r"/etc/yum/pluginconf.d/versionlock.list; do
    [ -r "$f" ] && awk '/^[^#! ]/ && /fabric/ { print "fmlock " $0 }' "$f"
  done
fi
{ lsmod 2>/dev/null; cat "$r/proc/modules" 2>/dev/null; } | awk '$1 == "nvidia_peermem" { f = 1 } END { print "peermem_loaded", f ? "yes" : "no" }'
for f in "$r"/etc/modules-load.d/*.conf "$r"/usr/lib/modules-load.d/*.conf "$r"/etc/modules; do
  [ -f "$f" ] && awk '{ sub(/#.*/, ""); if ($1 == "nvidia_peermem") f = 1 } END { exit !f }' "$f" && echo "peermem_boot ${f#$r}"
done
if [ -n "${SUDO_UID:-}" ]; then
  # Run through sudo (ssh.become): sudo's own session has limits of its own; the login's
  # ssh session above it is what every rank's non-login ssh session gets. /proc/PID/limits
  # says bytes; ulimit -l says KiB.
  p=$$ n=0
  while [ "$n" -lt 16 ] && [ "${p:-1}" -gt 1 ]; do
    if [ "$(awk '$1 == "Name:" { print $2 }' "/proc/$p/status" 2>/dev/null)" = sudo ]; then
      q=$(awk '$1 == "PPid:" { print $2 }' "/proc/$p/status")
      awk '/^Max locked memory/ { s = $4; h = $5; if (s != "unlimited") s = int(s / 1024); if (h != "unlimited") h = int(h / 1024); print "memlock", s, h }' "/proc/$q/limits" 2>/dev/null
      break
    fi
    p=$(awk '$1 == "PPid:" { print $2 }' "/proc/$p/status" 2>/dev/null); n=$((n + 1))
  done
else
  echo "memlock $(ulimit -S -l 2>/dev/null) $(ulimit -H -l 2>/dev/null)"
fi
# Other memlock lines: pam_limits ranks a later file's (or a user's own) line above ours, so
# a site file can give ranks less than the check above reads (it reads root's or the login's).
for f in "$r"/etc/security/limits.conf "$r"/etc/security/limits.d/*.conf; do
  [ -f "$f" ] && [ "${f#"$r"}" != "$memlock" ] || continue
  awk -v f="${f#"$r"}" '{ sub(/#.*/, "") } tolower($3) == "memlock" { print "memlock_other", f ":", $1, $2, $3, $4 }' "$f"
done | head -n 20
if command -v chronyc >/dev/null 2>&1; then
  timeout 10 chronyc tracking 2>/dev/null | sed 's/^/chrony /'
fi
tf_file memlock_conf "$r$memlock"
tf_file peermem_conf "$r$peermem"
exit 0
"""
)

# nvidia-smi -q -x prints a DTD *reference* without an internal subset, always the same line
# (`<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">`, v10..v13 by driver): exactly that
# line after the XML declaration is dropped, then the parser refuses every DTD, so an internal
# subset (an entity, a billion laughs) or any other DOCTYPE fails the read, never expands.
_SMI_DOCTYPE = re.compile(
    rb'\A(<\?xml [^>]*\?>\s*)<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v[0-9]+\.dtd">'
)
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


def _text(element: Element | None, path: str) -> str | None:
    found = None if element is None else element.findtext(path)
    return None if found is None else found.strip()


def read_smi_xml(encoded: str) -> tuple[str | None, list[GpuT]]:
    """The driver and each GPU's persistence mode and fabric state from ``nvidia-smi -q -x``
    (base64), each from its own element; raise ValueError for anything else."""
    try:
        data = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64 ({exc})") from exc
    try:
        root = fromstring(_SMI_DOCTYPE.sub(rb"\1", data, count=1), forbid_dtd=True)
    except DefusedXmlException as exc:
        raise ValueError(f"XML with a DTD or entities refused ({type(exc).__name__})") from exc
    except ParseError as exc:
        raise ValueError(f"not XML ({exc})") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi's XML (root <{root.tag[:40]}>)")
    gpus: list[GpuT] = [
        {
            "bus": (gpu.get("id") or "").strip(),
            "persistence": _text(gpu, "persistence_mode"),
            "fabric_state": _text(gpu.find("fabric"), "state"),
            "fabric_status": _text(gpu.find("fabric"), "status"),
        }
        for gpu in root.findall("gpu")
    ]
    return _text(root, "driver_version"), gpus


class GpuNodeState(FactBase[GpuNodeStateT]):
    """
    A node's GPU settings in one command: ``nvidia-smi -q -x`` (bounded by ``timeout``: driver,
    each GPU's persistence mode and NVSwitch fabric state), NVSwitches on the PCI bus, the
    systemd units (nvidia-persistenced, nvidia-fabricmanager, chrony, systemd-timesyncd), the
    fabric manager package and its hold, nvidia_peermem loaded and configured at boot, the
    locked-memory limit this non-login session has (``ulimit -l``), ``chronyc tracking`` or
    timesyncd's status, and trainfleet's limits.d and modules-load.d files. Missing tools
    read as absent (``smi: "absent"``, ``systemd: False``, ``offset_ms: None``), never as passing.

    + root: prefix of every file read ("" on nodes; tests point it at fixture trees)
    + timeout: seconds nvidia-smi may take

    .. code:: python

        {"smi": "ok", "driver": "565.57.01", "gpus": [{"bus": "00000000:18:00.0", "persistence": "Enabled",
         "fabric_state": "Completed", "fabric_status": "Success"}], "nvswitches": ["0000:05:00.0"],
         "systemd": True, "units": {"nvidia-persistenced": {"enabled": "enabled", "active": "active"}, ...},
         "fabricmanager": {"nvidia-fabricmanager-565": "565.57.01-1"}, "fabricmanager_held": [...],
         "peermem_loaded": True, "peermem_boot": ["/etc/modules-load.d/trainfleet-peermem.conf"],
         "memlock": "unlimited", "memlock_hard": "unlimited", "memlock_conf": "...", "peermem_conf": "...",
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
        }
