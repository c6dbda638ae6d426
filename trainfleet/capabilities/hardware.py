"""Hardware truth: what a node's GPUs, links and HCAs are, judged by the cluster's majority,
by the spec (its GPU count) and by health gates every node must pass.

Reads the ``hardware`` section (facts/hardware_facts.py: the raw sources, parsed by
trainfleet/hw into plain data); ``trainfleet diagnose`` gives a saved capture the same
``observed``. Properties name the slot (PCI address, GPU index, HCA and port) and what differs.
No operation: nothing here is changed on a node (remediation is #30's, opt-in).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from trainfleet.hw import kernel_log, lspci
from trainfleet.hw.sources import (
    CMDLINE,
    DMESG,
    INFINIBAND,
    LSPCI,
    NVLINK,
    SMI_XML,
    SOURCES,
    TOPO,
)
from trainfleet.model import Cluster
from trainfleet.plan_types import NodePlan, Sections

NONE = "none"
# Every node that has these must have the majority's value (the machine type, learned from
# the cluster itself: no expected state written by hand per machine type).
MAJORITY = (
    "GPU model",
    "GPU VBIOS",
    "GPU ECC mode",
    "GPU MIG mode",
    "GPU PCIe max",
    "NVLink GPU ",
    "NVLink fabric",
    "NVLink domain",
    "NVSwitches",
    "GPU-NIC affinity",
    "IB ",
    "machine",
    "IOMMU",
)
# Health gates: every node that reports one must report "none".
HEALTH = (
    "hardware sources",  # the section, and each source a node's checks depend on, was read
    "GPU PCIe link degraded",
    "GPU memory errors",
    "GPU Xid since boot",
    "NVLink fabric problems",
    "PCIe ACS above GPUs/NICs",
)


def virtual(hw: Mapping[str, Any]) -> bool:
    """The kernel said it found a hypervisor at boot, or the CPU flags say so (the boot line may
    have left the kernel's ring buffer)."""
    return bool((hw["kernel"] or {}).get("hypervisor") or hw["cpu_hypervisor"])


def _unreadable(hw: Mapping[str, Any], *names: str) -> str | None:
    why = [f"{name}: {hw['problems'][name]}" for name in names if name in hw["problems"]]
    return f"unreadable ({'; '.join(why)})" if why else None


def _set(values: list[Any]) -> str:
    seen = sorted({str(v) for v in values if v is not None})
    return ", ".join(seen) or "not reported"


def gpu_node(hw: Mapping[str, Any]) -> bool:
    """The GPU checks apply: nvidia-smi is there (its answer may still be unreadable), or,
    without it, the node shows a GPU anyway (the kernel logged an Xid, an SXid or a GPU fallen
    off the bus, or lspci lists an NVIDIA GPU): its GPU gates then say nvidia-smi was not read,
    never nothing."""
    if hw["status"].get(SMI_XML) not in ("absent", "skipped"):
        return True
    kernel = hw["kernel"] or {}
    if kernel.get("xids") or kernel.get("sxids") or kernel.get("fallen"):
        return True
    return any(lspci.is_gpu(d) for d in hw["pci"] or [])


def _gpu_props(hw: Mapping[str, Any]) -> dict[str, str]:
    gpus = hw["gpus"]
    if gpus is None:
        why = _unreadable(hw, SMI_XML) or "unreadable"
        return {"GPU count": why, "GPU memory errors": why, "NVLink fabric problems": why}
    models = Counter(g["model"] or "unknown" for g in gpus)
    props = {
        "GPU count": str(len(gpus)),
        "GPU model": ", ".join(f"{n} x {m}" for m, n in sorted(models.items())) or NONE,
        "GPU VBIOS": _set([g["vbios"] for g in gpus]),
        "GPU ECC mode": _set([g["ecc_mode"] for g in gpus]),
        "GPU MIG mode": _set([g["mig_mode"] for g in gpus]),
        "GPU PCIe max": _set(
            [f"gen{g['max_gen']} x{g['max_width']}" for g in gpus if g["max_width"]]
        ),
        "GPU memory errors": "; ".join(_memory(g) for g in gpus if _memory(g)) or NONE,
    }
    fabrics = [
        g
        for g in gpus
        if g["fabric"] and {g["fabric"]["state"], g["fabric"]["status"]} - {None, "N/A"}
    ]
    if fabrics:  # State/Status only: CliqueId and ClusterUUID differ between NVLink domains
        props["NVLink fabric"] = _set(
            [f"{g['fabric']['state']}/{g['fabric']['status']}" for g in fabrics]
        )
        domains = {
            (g["fabric"]["cluster"], g["fabric"]["clique"])
            for g in fabrics
            if g["fabric"]["cluster"] not in (None, "N/A")
        }
        if domains:
            props["NVLink domain"] = _domain(domains)
    bad = [
        f"GPU {g['bus']}: {g['fabric']['state']}/{g['fabric']['status']}"
        for g in fabrics
        if g["fabric"]["state"] != "Completed" or g["fabric"]["status"] not in ("Success", "N/A")
    ]
    props["NVLink fabric problems"] = "; ".join(bad) or NONE
    return props


ZERO_UUID = "00000000-0000-0000-0000-000000000000"


def _domain(domains: set[tuple[str, str]]) -> str:
    """The NVLink domain a node's GPUs are in (ClusterUUID, CliqueId): a multi-node one (a
    GB200 NVL rack) or this node alone (CliqueId 0, a zero ClusterUUID: an HGX board, or a node
    whose fabric manager did not join its rack's domain). Which multi-node domain is not
    compared: racks differ."""
    if any(cluster != ZERO_UUID for cluster, _ in domains):
        return "multi-node" if len(domains) == 1 else f"split across {len(domains)} domains"
    cliques = ", ".join(sorted(str(clique) for _, clique in domains))
    return f"this node alone (CliqueId {cliques}, ClusterUUID zero)"


# The sources a GPU node's (or an HCA node's) checks read: one that failed fails the node, even
# where the properties it feeds would simply be missing (a majority vote counts only the nodes
# that have a property). nvidia-smi topo -m is captured, not judged; cpuinfo's flags line is a
# hint (arm64 has none).
GPU_SOURCES = (SMI_XML, NVLINK, LSPCI, DMESG, CMDLINE)
HCA_SOURCES = (LSPCI, DMESG, CMDLINE, INFINIBAND)


def _sources(hw: Mapping[str, Any], names: tuple[str, ...]) -> str:
    failed = [f"{name}: {hw['problems'][name]}" for name in names if name in hw["problems"]]
    return "; ".join(failed) or NONE


def _memory(gpu: Mapping[str, Any]) -> str:
    """What a GPU's memory reports against it (empty: nothing)."""
    found = []
    if gpu["uncorrectable"]:
        found.append(f"{gpu['uncorrectable']} uncorrectable ECC errors since the driver loaded")
    for key, words in (
        ("row_remap_pending", "row remap pending (reset the GPU)"),
        ("row_remap_failure", "row remap failed"),
        ("retirement_pending", "page retirement pending (reset the GPU)"),
        ("reset_required", "reset required"),
    ):
        if gpu[key]:
            found.append(words)
    if gpu["recovery_action"] not in (None, "None", "N/A"):
        found.append(f"recovery action {gpu['recovery_action']}")
    return f"GPU {gpu['bus']}: {', '.join(found)}" if found else ""


def _links_degraded(hw: Mapping[str, Any]) -> str:
    """GPUs (nvidia-smi) and NICs (lspci) trained below their width; a GPU's speed only in P0,
    where idle power saving cannot explain a lower generation."""
    found = []
    for g in hw["gpus"] or []:
        if g["width"] and g["max_width"] and g["width"] < g["max_width"]:
            found.append(f"GPU {g['bus']} x{g['width']} of x{g['max_width']}")
        if g["pstate"] == "P0" and g["gen"] and g["max_gen"] and g["gen"] < g["max_gen"]:
            found.append(f"GPU {g['bus']} gen{g['gen']} of gen{g['max_gen']} in P0")
    for d in hw["pci"] or []:
        cap, sta = d["link_cap"], d["link_sta"]
        if lspci.is_nic(d) and cap and sta and sta["width"] < cap["width"]:
            found.append(f"NIC {d['address']} x{sta['width']} of x{cap['width']}")
    # the GPUs' links are nvidia-smi's, the NICs' lspci's: a half not read is said, never "none"
    unread = [name for name, part in ((SMI_XML, hw["gpus"]), (LSPCI, hw["pci"])) if part is None]
    if unread:
        found.append(_unreadable(hw, *unread) or "unreadable")
    return "; ".join(found) or NONE


def _xids(hw: Mapping[str, Any]) -> str:
    kernel = hw["kernel"]
    if kernel is None:
        return _unreadable(hw, DMESG) or "unreadable"
    counts = Counter(
        f"{x['pci']}: {kernel_log.xid_name(x['xid'])}"
        for x in kernel_log.hardware_xids(kernel["xids"])
    )
    counts.update(f"{pci}: GPU has fallen off the bus" for pci in kernel["fallen"])
    counts.update(
        f"NVSwitch {x['pci']}{_link(x)}: {kernel_log.sxid_name(x['xid'])}"
        for x in kernel_log.hardware_sxids(kernel["sxids"])
    )
    return "; ".join(f"{what} x{n}" for what, n in counts.items()) or NONE


def _link(sxid: Mapping[str, Any]) -> str:
    return "" if sxid.get("link") is None else f" link {sxid['link']}"


def _acs(hw: Mapping[str, Any]) -> str | None:
    """Switch ports above a GPU or NIC whose ACS redirects peer-to-peer traffic; None in a
    virtual machine (its hypervisor's ACS is not the node's to judge)."""
    if virtual(hw):
        return None
    if hw["pci"] is None:
        return _unreadable(hw, LSPCI) or "unreadable"
    if any(d["denied"] for d in hw["pci"]):
        return "unreadable (lspci could not read capabilities: not run as root)"
    found = [
        f"{bridge['address']} above {device['address']}: {' '.join(bits)}"
        for bridge, device in lspci.switch_ports_above(hw["pci"])
        if (bits := lspci.acs_enabled(bridge))
    ]
    return "; ".join(found) or NONE


def _affinity(devices: list[dict[str, Any]]) -> str:
    """Each GPU's NICs behind the same PCIe switch, from lspci's bridges (``none``: it reaches
    every NIC through the CPU's root complex)."""
    gpus = [d for d in devices if lspci.is_gpu(d)]
    return (
        "; ".join(
            f"{g['address']}: {', '.join(lspci.nics_beside(g, devices)) or 'none'}" for g in gpus
        )
        or NONE
    )


def _nvlinks(hw: Mapping[str, Any]) -> dict[str, str]:
    props = {}
    for index, links in sorted((hw["nvlinks"] or {}).items()):
        speeds = Counter(v for v in links.values() if v != "<inactive>")
        inactive = sorted(k for k, v in links.items() if v == "<inactive>")
        value = ", ".join(f"{n} at {s}" for s, n in sorted(speeds.items())) or "no link active"
        if inactive:
            value += f"; inactive: links {', '.join(map(str, inactive))}"
        props[f"NVLink GPU {index}"] = value
    return props


def _infiniband(hw: Mapping[str, Any]) -> dict[str, str]:
    props = {}
    if hw["status"].get(INFINIBAND) == "absent":
        props["IB HCAs"] = NONE  # (only GPU nodes get here without HCAs)
    elif hw["infiniband"] is not None:  # a node missing an HCA its peers have is named here
        names = sorted(hw["infiniband"])
        props["IB HCAs"] = f"{len(names)}: {', '.join(names)}" if names else NONE
    for name, hca in sorted((hw["infiniband"] or {}).items()):
        props[f"IB {name} firmware"] = hca["fw"] or "not reported"
        props[f"IB {name} board"] = hca["board"] or "not reported"
        for port, p in sorted(hca["ports"].items()):
            props[f"IB {name}:{port} link"] = (
                f"{p['state'] or '?'}, {p['phys_state'] or '?'}, {p['link_layer'] or '?'}"
            )
            props[f"IB {name}:{port} rate"] = p["rate"] or "not reported"
    return props


def observed(hw: Mapping[str, Any] | None) -> dict[str, str]:
    """A node's hardware properties from its plain data (``read_hardware``); None: the
    section could not be read."""
    if hw is None:
        return {"hardware sources": "unreadable (no hardware section in the node's answer)"}
    props: dict[str, str] = {}
    hcas = hw["status"].get(INFINIBAND) == "ok"
    if not (gpu_node(hw) or hcas):  # a CPU node without HCAs: none of this is its to share
        return props
    props["hardware sources"] = _sources(hw, GPU_SOURCES if gpu_node(hw) else HCA_SOURCES)
    if hw["iommu"] is not None:
        props["IOMMU (kernel command line)"] = " ".join(hw["iommu"]) or "kernel default"
    if hw["kernel"] is not None or hw["cpu_hypervisor"] is not None:
        hypervisor = (hw["kernel"] or {}).get("hypervisor")
        props["machine"] = (
            f"virtual machine ({hypervisor})"
            if hypervisor
            else "virtual machine"
            if hw["cpu_hypervisor"]
            else "bare metal"
        )
    if gpu_node(hw):
        props |= _gpu_props(hw)
        props["GPU PCIe link degraded"] = _links_degraded(hw)
        props["GPU Xid since boot"] = _xids(hw)
        if (acs := _acs(hw)) is not None:
            props["PCIe ACS above GPUs/NICs"] = acs
        if hw["pci"] is not None:
            props["GPU-NIC affinity"] = _affinity(hw["pci"])
            props["NVSwitches"] = str(
                sum(1 for d in hw["pci"] if d["class"] == "Bridge" and "NVIDIA" in d["name"])
            )
    props |= _nvlinks(hw)
    props |= _infiniband(hw)
    return props


def expected(gpus: int | None) -> dict[str, str]:
    """What the spec says of a node's hardware: its GPU count (``nodes[].gpus``; None: no
    spec, 0: a CPU node, whose GPUs the identity capability checks)."""
    return {"GPU count": str(gpus)} if gpus else {}


# ---- the capability ------------------------------------------------------------------------


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {"hardware": ("HardwareState", {})}


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    return observed(fp.get("hardware"))


def expect(plan: NodePlan) -> dict[str, str]:
    return expected(plan.node.gpus)


def converged(plan: NodePlan) -> dict[str, Any]:
    """A healthy node with the spec's GPUs (plain data, as read_hardware gives it): full-width
    links, no Xid, no memory error, bare metal; a CPU node has no nvidia-smi, and its command
    line and CPU flags are its own (no property of a CPU node reads them)."""
    gpus = [
        {
            "bus": f"00000000:{0x18 + i:02x}:00.0",
            "index": i,
            "model": "NVIDIA GPU",
            "serial": None,
            "uuid": None,
            "vbios": None,
            "ecc_mode": "Enabled",
            "mig_mode": "Disabled",
            "pstate": "P0",
            "width": 16,
            "max_width": 16,
            "replays": 0,
            "gen": 5,
            "max_gen": 5,
            "uncorrectable": 0,
            "row_remap_pending": False,
            "row_remap_failure": False,
            "retirement_pending": False,
            "reset_required": False,
            "recovery_action": "None",
            "fabric": None,
        }
        for i in range(plan.node.gpus)
    ]
    status = {name: "ok" for name in SOURCES}
    if not gpus:
        status |= {SMI_XML: "absent", NVLINK: "absent", TOPO: "absent"}
        status |= {LSPCI: "skipped", DMESG: "skipped", INFINIBAND: "absent"}
    # read_hardware names each source it reads that was not read (topo -m is read elsewhere)
    problems = {name: how for name, how in status.items() if how != "ok" and name != TOPO}
    own: set[str] = set() if gpus else {"iommu", "cpu_hypervisor"}
    value: dict[str, Any] = {
        "hardware": {
            "status": status,
            "problems": problems,
            "gpus": gpus or None,
            "kernel": {"xids": [], "sxids": [], "fallen": [], "hypervisor": None} if gpus else None,
            "pci": [] if gpus else None,
            "nvlinks": {} if gpus else None,
            "iommu": [],
            "cpu_hypervisor": False,
            "infiniband": {} if gpus else None,
        }
    }
    return {"hardware": {k: v for k, v in value["hardware"].items() if k not in own}}
