"""``nvidia-smi -q -x``: a safe parse of the document and each GPU's hardware facts."""

from __future__ import annotations

import re
from typing import Any
from xml.etree.ElementTree import Element, ParseError

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring

# nvidia-smi -q -x prints a DTD *reference* without an internal subset, always the same line
# (`<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">`, v10..v13 by driver): exactly that
# line after the XML declaration is dropped, then the parser refuses every DTD, so an internal
# subset (an entity, a billion laughs) or any other DOCTYPE fails the read, never expands.
_SMI_DOCTYPE = re.compile(
    rb'\A(<\?xml [^>]*\?>\s*)<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v[0-9]+\.dtd">'
)
_WIDTH = re.compile(r"([0-9]+)x")


def smi_root(data: bytes) -> Element:
    """The ``<nvidia_smi_log>`` element of ``nvidia-smi -q -x``'s output; ValueError for a
    document with an internal DTD or entities, one that is not XML, or another root."""
    try:
        root = fromstring(_SMI_DOCTYPE.sub(rb"\1", data, count=1), forbid_dtd=True)
    except DefusedXmlException as exc:
        raise ValueError(f"XML with a DTD or entities refused ({type(exc).__name__})") from exc
    except (ParseError, LookupError, UnicodeError) as exc:  # LookupError: an unknown encoding
        raise ValueError(f"not XML ({str(exc)[:80]})") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi's XML (root <{root.tag[:40]}>)")
    # A process name is a user's text inside the document: should nvidia-smi ever let markup
    # through it, a GPU could be added; never more GPUs than nvidia-smi says are attached (fewer:
    # ``-i`` asked for some; a hidden one is below the spec's count).
    attached = (root.findtext("attached_gpus") or "").strip()
    held = len(root.findall("gpu"))
    if not attached.isdigit() or held > int(attached):
        raise ValueError(f"attached_gpus says {attached[:8]!r}, the document holds {held} GPUs")
    return root


def text(element: Element | None, path: str) -> str | None:
    """The stripped text at ``path`` under ``element``; None where there is no such element."""
    found = None if element is None else element.findtext(path)
    return None if found is None else found.strip()


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _width(value: str | None) -> int | None:
    found = _WIDTH.fullmatch(value or "")
    return int(found.group(1)) if found else None


def _yes(value: str | None) -> bool | None:
    """``Yes``/``No`` as a bool; None for ``N/A`` or no element (not reported by this GPU)."""
    return {"Yes": True, "No": False}.get(value or "")


def _uncorrectable(gpu: Element) -> int | None:
    """Volatile (since the driver loaded) uncorrectable DRAM ECC errors: ``dram_uncorrectable``
    (DTD v12 and later) or the older ``double_bit/total``; None where ECC reports none (N/A)."""
    volatile = gpu.find("ecc_errors/volatile")
    dram = _int(text(volatile, "dram_uncorrectable"))
    if dram is None:
        return _int(text(volatile, "double_bit/total"))
    sram = [
        _int(text(volatile, p)) or 0
        for p in ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "sram_uncorrectable")
    ]
    return dram + sum(sram)


def gpus(root: Element) -> list[dict[str, Any]]:
    """Each GPU's identity, PCIe link, modes, memory health and NVLink fabric, from its own
    elements (a process name elsewhere in the document cannot reach them)."""
    found = []
    for index, gpu in enumerate(root.findall("gpu")):
        link = gpu.find("pci/pci_gpu_link_info")
        fabric = gpu.find("fabric")
        found.append(
            {
                "bus": (gpu.get("id") or "").strip(),
                "index": index,  # nvidia-smi's order: its GPU index (PCI bus order)
                "model": text(gpu, "product_name"),
                "serial": text(gpu, "serial"),
                "uuid": text(gpu, "uuid"),
                "vbios": text(gpu, "vbios_version"),
                "ecc_mode": text(gpu, "ecc_mode/current_ecc"),
                "mig_mode": text(gpu, "mig_mode/current_mig"),
                "pstate": text(gpu, "performance_state"),
                "width": _width(text(link, "link_widths/current_link_width")),
                "max_width": _width(text(link, "link_widths/max_link_width")),
                "replays": _int(text(gpu, "pci/replay_counter")),  # PCIe replays since reset
                "gen": _int(text(link, "pcie_gen/current_link_gen")),
                "max_gen": _int(text(link, "pcie_gen/max_link_gen")),
                "uncorrectable": _uncorrectable(gpu),
                "row_remap_pending": _yes(text(gpu, "remapped_rows/remapped_row_pending")),
                "row_remap_failure": _yes(text(gpu, "remapped_rows/remapped_row_failure")),
                "retirement_pending": _yes(text(gpu, "retired_pages/pending_retirement")),
                "reset_required": _yes(text(gpu, "gpu_reset_status/reset_required")),
                # newer drivers (R570+) say what the GPU needs instead: None, or a reset, a reboot
                "recovery_action": text(gpu, "gpu_recovery_action"),
                "fabric": None
                if fabric is None
                else {
                    "state": text(fabric, "state"),
                    "status": text(fabric, "status"),
                    "clique": text(fabric, "cliqueId"),
                    "cluster": text(fabric, "clusterUuid"),
                },
            }
        )
    return found
