"""Facts of a node's hardware: its raw sources in one command (``HardwareSources``, what a
capture saves) and what they say as plain data (``HardwareState``, what drift compares;
trainfleet/hw parses both the same way)."""

from __future__ import annotations

import base64
import binascii
from types import MappingProxyType
from typing import Any

from pyinfra.api import FactBase, StringCommand

from facts.gpu_node_facts import SMI_TIMEOUT
from facts.shell import script, shell
from trainfleet.hw import cmdline
from trainfleet.hw.kernel_log import GREP
from trainfleet.hw.sources import (
    CMDLINE,
    CPUINFO,
    INFINIBAND,
    RDMA_CM,
    STATUS,
    SYS_CLASS_NET,
    TREE_PATHS,
    TREES,
    is_source,
    read_hardware,
)

_SCRIPT = script("hardware.sh")
# a tree's file lines: "<tag> <path below the tree> <value>"
_TREE_TAGS = MappingProxyType({"ib": INFINIBAND, "net": SYS_CLASS_NET, "cm": RDMA_CM})


def _decode(encoded: str) -> str:
    try:
        data = base64.b64decode(encoded.strip(), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not base64 ({exc})") from exc
    return data.decode("utf-8", "replace")


class HardwareSources(FactBase[dict[str, Any]]):
    """
    A node's hardware sources, each a tool's whole output (``nvidia-smi -q -x``, ``nvidia-smi
    nvlink -s``, ``nvidia-smi topo -m``, ``lspci -vvv``, the kernel log, ``/proc/cmdline``),
    the InfiniBand sysfs tree (with the GID entries in use and ``tc/1/traffic_class``) and each
    HCA's PCI function (``hca-pci.txt``), with what became of each (``ok``, ``absent``,
    ``exit N``, ``skipped``); a capture also each RoCE netdev's ``mlnx_qos -i`` (bounded) and
    ECN enables, and rdma_cm's ToS where its configfs folder exists (docs/hardware.md). Nothing
    is changed on the node: configfs is read, never made.

    + mode: ``check`` (drift: the kernel log's matching lines only; lspci and the log only on
      nodes with a GPU or HCA) or ``capture`` (everything, whole)
    + timeout: seconds each nvidia-smi may take
    + root: prefix of the sysfs and /proc files read ("" on nodes; tests point it at fixture trees)

    .. code:: python

        {"status": {"nvidia-smi-q.xml": "ok", "lspci-vvv.txt": "absent", ...},
         "files": {"nvidia-smi-q.xml": "<?xml ...",
                   "sys-class-infiniband/mlx5_0/fw_ver": "28.39.1002"}}
    """

    def command(
        self, mode: str = "check", timeout: int = SMI_TIMEOUT, root: str = ""
    ) -> StringCommand:
        if mode not in ("check", "capture"):
            raise ValueError(f"mode {mode!r}: check or capture")
        return shell(_SCRIPT, mode, int(timeout), GREP, root)

    def process(self, output: list[str]) -> dict[str, Any]:
        status: dict[str, str] = {}
        files: dict[str, str] = {}
        for line in output:
            tag, _, rest = line.partition(" ")
            if tag == "src":
                name, _, how = rest.partition(" ")
                if not is_source(name) or name in status:
                    raise ValueError(f"source {name[:40]!r} unknown or given twice")
                state, _, encoded = how.partition(" ")
                if state == "ok":
                    status[name] = "ok"
                    if name not in TREES:
                        files[name] = _decode(encoded)
                elif STATUS.fullmatch(how.strip()):
                    status[name] = how.strip()
                else:
                    raise ValueError(f"source {name}: status {how[:40]!r}")
            elif tree := _TREE_TAGS.get(tag):
                path, _, value = rest.partition(" ")
                if TREE_PATHS[tree].fullmatch(path):  # the kernel's names only; else dropped
                    files[f"{tree}/{path}"] = value
        return {"status": status, "files": files}

    @staticmethod
    def default() -> dict[str, Any]:
        return {"status": {}, "files": {}}


class HardwareState(HardwareSources):
    """
    What a node's hardware sources say (trainfleet.hw.sources.read_hardware): its GPUs, kernel
    events, PCI devices, NVLinks, IOMMU settings and InfiniBand HCAs; a source not read is None.
    """

    def process(self, output: list[str]) -> dict[str, Any]:
        raw = super().process(output)
        return read_hardware(raw["status"], raw["files"])

    @staticmethod
    def default() -> None:
        """No output at all (the script always prints every source's line): unreadable."""
        return None

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the script prints on the node ``recorded`` holds once its sources say
        ``value``: a source ``value`` says was not read printed as such, the kernel's command
        line with ``value``'s IOMMU settings, the CPU flags with or without ``hypervisor``;
        every other source as recorded. What a recorded source cannot be made to say (GPUs,
        links, kernel events of a node that has none) is a ValueError, never a wrong answer."""
        old = self.process(recorded)
        lines = list(recorded)
        for name, how in value.get("status", {}).items():
            if how != "ok" and how != old["status"].get(name):
                lines = _with_source(lines, name, None, how)
        raw = HardwareSources().process(lines)
        if "iommu" in value and value["iommu"] != old["iommu"] and CMDLINE in raw["files"]:
            words = [w for w in raw["files"][CMDLINE].split() if not cmdline.iommu(w)]
            lines = _with_source(lines, CMDLINE, " ".join([*words, *value["iommu"]]))
        wanted = value.get("cpu_hypervisor")
        if wanted is not None and wanted != old["cpu_hypervisor"] and CPUINFO in raw["files"]:
            lines = _with_source(lines, CPUINFO, _hypervisor(raw["files"][CPUINFO], wanted))
        said = self.process(lines)
        wrong = [key for key in value if said.get(key) != value[key]]
        if wrong:
            raise ValueError(f"the recorded sources cannot say {', '.join(wrong)} as asked")
        return lines


def _with_source(lines: list[str], name: str, text: str | None, how: str = "ok") -> list[str]:
    """``lines`` with source ``name`` read as ``text`` (None: not read, ``how``)."""
    line = (
        f"src {name} {how}"
        if text is None
        else f"src {name} ok {base64.b64encode(text.encode()).decode()}"
    )
    kept = [
        each
        for each in lines
        if not each.startswith(f"src {name} ")
        and not (name == INFINIBAND and each.startswith("ib "))
    ]
    return [*kept, line]


def _hypervisor(cpuinfo: str, present: bool) -> str:
    """/proc/cpuinfo's text with the ``hypervisor`` flag on its flags lines, or without it."""

    def flags(line: str) -> str:
        if not line.startswith("flags"):
            return line
        key, _, words = line.partition(":")
        kept = [w for w in words.split() if w != "hypervisor"]
        return f"{key}: {' '.join([*kept, 'hypervisor'] if present else kept)}"

    return "\n".join(flags(line) for line in cpuinfo.split("\n"))
