"""The raw sources of a node's hardware, by the file names a capture saves them under
(docs/hardware.md), and what they say as plain data (``read_hardware``).

``status`` says for each source what became of it on the node: ``ok``, ``absent`` (no such
tool or directory), ``exit N`` (the tool failed; 124: timed out) or ``skipped`` (nothing to
read it for: no GPU and no HCA). A source that is not ``ok`` reads as None, and every check
that needs it says so: it never passes on nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trainfleet.hw import cmdline, infiniband, kernel_log, lspci, nvlink, smi_xml

SMI_XML = "nvidia-smi-q.xml"
NVLINK = "nvidia-smi-nvlink-s.txt"
TOPO = "nvidia-smi-topo-m.txt"
LSPCI = "lspci-vvv.txt"
DMESG = "dmesg.txt"
CMDLINE = "cmdline"
CPUINFO = "cpuinfo"  # /proc/cpuinfo (drift reads its first flags line)
INFINIBAND = "sys-class-infiniband"  # a directory: the sysfs tree's files below it
SOURCES = (SMI_XML, NVLINK, TOPO, LSPCI, DMESG, CMDLINE, CPUINFO, INFINIBAND)
STATUS_FILE = "sources.txt"  # a capture's "<source> <status>" lines
# a source holding a NUL byte is no tool's text output (sysfs values included): refused, named
NOT_TEXT = "not text (it holds a NUL byte)"
STATUS = re.compile(r"ok|absent|skipped|exit [0-9]{1,3}")
# a file below sys-class-infiniband/: words, dots and dashes, never ".." or an absolute path
IB_PATH = re.compile(r"(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9_.-]{1,64}(?:/[A-Za-z0-9_.-]{1,64}){1,5}")


def read_hardware(status: Mapping[str, str], files: Mapping[str, str]) -> dict[str, Any]:
    """A node's hardware as plain data from its sources (``files``: source name, or
    ``sys-class-infiniband/<path>``, -> text). Each part is None where its source was not read
    or could not be parsed (``problems`` says why)."""
    problems: dict[str, str] = {}

    def source(name: str) -> str | None:
        state = status.get(name, "not read")
        if state != "ok":
            problems[name] = state
            return None
        if name != INFINIBAND and name not in files:
            problems[name] = "missing"
            return None
        texts = (
            [v for k, v in files.items() if k.startswith(INFINIBAND + "/")]
            if name == INFINIBAND
            else [files[name]]
        )
        if any("\0" in text for text in texts):
            problems[name] = f"refused: {NOT_TEXT}"
            return None
        return files.get(name, "")

    gpus = None
    if (xml := source(SMI_XML)) is not None:
        try:
            gpus = smi_xml.gpus(smi_xml.smi_root(xml.encode()))
        except ValueError as exc:
            problems[SMI_XML] = f"refused: {exc}"
    log = source(DMESG)
    pci = None
    if (text := source(LSPCI)) is not None:
        pci = lspci.devices(text)
        if not pci:  # every machine has a host bridge; a GPU or HCA node has more
            problems[LSPCI], pci = "refused: no PCI device read from it", None
    links = None
    if (text := source(NVLINK)) is not None:
        links = nvlink.links(text)
        if text.strip() and not links:  # empty: a GPU without NVLinks (a VM's)
            problems[NVLINK], links = "refused: no 'GPU N:' line read from it", None
    line = source(CMDLINE)
    cpu = source(CPUINFO)
    ib = None
    if source(INFINIBAND) is not None:
        prefix = INFINIBAND + "/"
        ib = infiniband.hcas(
            {name[len(prefix) :]: text for name, text in files.items() if name.startswith(prefix)}
        )
    return {
        "status": {name: status.get(name, "not read") for name in SOURCES},
        "problems": problems,
        "gpus": gpus,
        "kernel": None if log is None else kernel_log.read(log),
        "pci": pci,
        "nvlinks": links,
        "iommu": None if line is None else cmdline.iommu(line),
        "cpu_hypervisor": None if cpu is None else cmdline.hypervisor_flag(cpu),
        "infiniband": ib,
    }
