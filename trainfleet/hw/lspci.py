"""``lspci -vvv``: each device's class, PCIe link (capable vs trained) and, on bridges, the
bus range below them and their ACS control bits."""

from __future__ import annotations

import re
from typing import Any

_HEADER = re.compile(
    r"((?:[0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) ([A-Za-z0-9 /\[\]-]{1,60}): (.*)"
)
_LINK = re.compile(r"Speed ([0-9.]+GT/s)[^,]*, Width x([0-9]+)")
_BUS = re.compile(r"Bus: primary=([0-9a-f]{2}), secondary=([0-9a-f]{2}), subordinate=([0-9a-f]{2})")
_EXPRESS = re.compile(r"Capabilities: \[[0-9a-f]+\] Express \([^)]*\) ([A-Za-z ]+?)(?: \(|,|$)")
_FLAG = re.compile(r"([A-Za-z]+)([+-])")
# ACS bits that send peer-to-peer traffic up to the root complex (or drop it) instead of across
# the switch: NCCL's troubleshooting guide has ACS disabled on PCIe switches for GPUDirect.
ACS_REDIRECTS = ("SrcValid", "ReqRedir", "CmpltRedir")


def _address(text: str) -> str:
    return text if text.count(":") == 2 else f"0000:{text}"


def devices(text: str) -> list[dict[str, Any]]:
    """Every device: ``{"address", "class", "name", "port", "link_cap", "link_sta", "bus",
    "acs", "denied", "driver"}`` (``link_*``: ``{"speed", "width"}``; ``bus``: the secondary and
    subordinate bus numbers of a bridge; ``acs``: the ACSCtl flags; ``denied``: lspci could not
    read the capabilities, not run as root; ``driver``: the kernel driver in use, or None)."""
    found: list[dict[str, Any]] = []
    device: dict[str, Any] | None = None
    for line in text.splitlines():
        if not line.startswith(("\t", " ")):
            header = _HEADER.fullmatch(line.strip())
            device = None
            if header:
                device = {
                    "address": _address(header.group(1)),
                    "class": header.group(2),
                    "name": header.group(3),
                    "port": None,
                    "link_cap": None,
                    "link_sta": None,
                    "bus": None,
                    "acs": None,
                    "denied": False,
                    "driver": None,
                }
                found.append(device)
            continue
        if device is None:
            continue
        body = line.strip()
        key, _, value = body.partition(":")
        if body.startswith("Capabilities: <access denied>"):
            device["denied"] = True
        elif express := _EXPRESS.match(body):
            device["port"] = express.group(1).strip()
        elif key in ("LnkCap", "LnkSta") and (link := _LINK.search(value)):
            slot = "link_cap" if key == "LnkCap" else "link_sta"
            device[slot] = {"speed": link.group(1), "width": int(link.group(2))}
        elif key == "Kernel driver in use":
            device["driver"] = value.strip()
        elif key == "ACSCtl":
            device["acs"] = {name: sign == "+" for name, sign in _FLAG.findall(value)}
        elif bus := _BUS.match(body):
            device["bus"] = (int(bus.group(2), 16), int(bus.group(3), 16))
    return found


def is_gpu(device: dict[str, Any]) -> bool:
    return device["class"] in ("3D controller", "VGA compatible controller") and (
        "NVIDIA" in device["name"]
    )


def is_nic(device: dict[str, Any]) -> bool:
    return device["class"] == "Infiniband controller" or (
        device["class"] == "Ethernet controller" and "Mellanox" in device["name"]
    )


def bridges_above(device: dict[str, Any], every: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The bridges whose bus range holds ``device``'s bus, in its PCI domain."""
    domain, bus = device["address"][:4], int(device["address"][5:7], 16)
    return [
        b
        for b in every
        if b["bus"] and b["address"][:4] == domain and b["bus"][0] <= bus <= b["bus"][1]
    ]


def acs_enabled(device: dict[str, Any]) -> list[str]:
    """The redirecting ACS bits set on a bridge (empty: none, or no ACS capability)."""
    return [bit for bit in ACS_REDIRECTS if (device["acs"] or {}).get(bit)]


SWITCH_PORTS = ("Upstream Port", "Downstream Port")


def switch_ports_above(every: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(PCIe switch port, the GPU or NIC below it) for every such pair, in lspci's device order:
    the ports whose ACS the hardware check judges and the remediation clears."""
    return [
        (bridge, device)
        for device in every
        if is_gpu(device) or is_nic(device)
        for bridge in bridges_above(device, every)
        if bridge["port"] in SWITCH_PORTS
    ]


def nics_beside(gpu: dict[str, Any], every: list[dict[str, Any]]) -> list[str]:
    """The NICs that share a PCIe switch with ``gpu`` (nvidia-smi topo's PIX or PXB: traffic
    between them need not cross the CPU's root complex, as GPUDirect RDMA wants)."""
    switches = {b["address"] for b in bridges_above(gpu, every) if b["port"] in SWITCH_PORTS}
    return sorted(
        d["address"]
        for d in every
        if is_nic(d)
        and any(
            b["address"] in switches
            for b in bridges_above(d, every)
            if b["port"] == "Upstream Port"
        )
    )
