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
from types import MappingProxyType
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
# The RDMA fabric's sources (#40). A capture made before them has none: each reads "not read",
# never a refusal. hca-pci.txt: "<hca> <PCI function> [<netdev> ...]" a line (the HCA's device
# link, read); the trees hold the RoCE netdevs' ECN enables (``<netdev>/ecn/roce_np/enable/<N>``)
# and rdma_cm's configfs ToS (``<hca>/ports/<p>/default_roce_tos``); mlnx-qos/<netdev>.txt is
# ``mlnx_qos -i <netdev>``, one source a RoCE netdev (drift's live read: the NcclNetwork fact).
HCA_PCI = "hca-pci.txt"
SYS_CLASS_NET = "sys-class-net"
RDMA_CM = "rdma_cm"
MLNX_QOS = "mlnx-qos"
FABRIC_SOURCES = (HCA_PCI, SYS_CLASS_NET, RDMA_CM)
TREES = (INFINIBAND, SYS_CLASS_NET, RDMA_CM)  # directories: their files below them
# a netdev name as the kernel allows it (IFNAMSIZ 16 with its NUL) and a path or command may
# carry: never "." or "..", never an option
NETDEV = re.compile(r"(?!\.\.?$)(?!-)[A-Za-z0-9_.-]{1,15}")
QOS_SOURCE = re.compile(rf"{MLNX_QOS}/((?!\.\.?\.txt$)(?!-)[A-Za-z0-9_.-]{{1,15}})\.txt")
STATUS_FILE = "sources.txt"  # a capture's "<source> <status>" lines
# a source holding a NUL byte is no tool's text output (sysfs values included): refused, named
NOT_TEXT = "not text (it holds a NUL byte)"
STATUS = re.compile(r"ok|absent|skipped|exit [0-9]{1,3}")
# a file below sys-class-infiniband/: words, dots and dashes, never ".." or an absolute path
IB_PATH = re.compile(r"(?!.*(?:^|/)\.\.?(?:/|$))[A-Za-z0-9_.-]{1,64}(?:/[A-Za-z0-9_.-]{1,64}){1,5}")
# the files the fabric's trees may hold, and nothing else (the contract helper parsers read)
NET_PATH = re.compile(r"(?!\.\.?/)(?!-)[A-Za-z0-9_.-]{1,15}/ecn/roce_(?:np|rp)/enable/[0-7]")
CM_PATH = re.compile(r"(?!\.\.?/)[A-Za-z0-9_.-]{1,64}/ports/[0-9]{1,3}/default_roce_tos")
TREE_PATHS = MappingProxyType({INFINIBAND: IB_PATH, SYS_CLASS_NET: NET_PATH, RDMA_CM: CM_PATH})


def is_source(name: str) -> bool:
    """A source a node may send or a capture list: a fixed name, or mlnx-qos/<netdev>.txt."""
    return name in SOURCES or name in FABRIC_SOURCES or bool(QOS_SOURCE.fullmatch(name))


def tree_file(name: str) -> bool:
    """``name`` is a file of one of the trees (``sys-class-infiniband/mlx5_0/fw_ver``), by
    that tree's grammar: never absolute, never ``..``."""
    tree, _, path = name.partition("/")
    return tree in TREE_PATHS and bool(TREE_PATHS[tree].fullmatch(path))


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
