"""``nvidia-smi -q -x``: a safe parse of the document and each GPU's hardware facts."""

from __future__ import annotations

import re
from typing import Any, cast
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
# A GPU element's opening tag (not <gpu_...>), nvidia-smi's count of GPUs (printed before the
# first GPU: no process name precedes it), and the process list's own tags (not
# <accounted_processes>; an empty list may print as <processes />, which holds no name).
_GPU_OPEN = re.compile(rb"<gpu[\s>]")
_ATTACHED = re.compile(rb"<attached_gpus>\s*([0-9]{1,4})\s*</attached_gpus>")
_PROCESSES, _END_PROCESSES = b"<processes>", b"</processes>"
# The elements nvidia-smi prints more than once under one parent (its DTDs: gpu+, mig_device*,
# process_info*, accounted_process_info*, supported_mem_clock*, supported_graphics_clock*).
# Any other tag twice under one parent is not nvidia-smi's.
REPEATED = frozenset(
    {
        ("nvidia_smi_log", "gpu"),
        ("mig_devices", "mig_device"),
        ("processes", "process_info"),
        ("accounted_processes", "accounted_process_info"),
        ("supported_clocks", "supported_mem_clock"),
        ("supported_mem_clock", "supported_graphics_clock"),
    }
)


def _attached(head: bytes) -> int:
    found = _ATTACHED.search(head)
    if found is None:
        raise ValueError("no <attached_gpus> before the first GPU")
    return int(found.group(1))


def without_process_lists(data: bytes) -> bytes:
    """The document with each GPU's ``<processes>`` content cut out, as bytes, before any
    parse: a process name is its owner's text, and where nvidia-smi does not escape it, it can
    hold any markup (or bytes that are not UTF-8). Whatever a name holds lies between its GPU's
    real ``<processes>`` and ``</processes>``: all that text goes, from the first of the one to
    the last of the other in the GPU's stretch of the document (from its ``<gpu ...>`` to the
    next). A name could open a GPU of its own and split a stretch in two: more stretches than
    nvidia-smi's count of GPUs (printed before any name) are refused (ValueError), and so are
    fewer (``-i``, a trimmed document) where a process list held anything."""
    starts = [m.start() for m in _GPU_OPEN.finditer(data)]
    attached = _attached(data[: starts[0]] if starts else data)
    if len(starts) > attached:
        raise ValueError(f"attached_gpus says {attached}, the document opens {len(starts)} GPUs")
    parts, names = [data[: starts[0]] if starts else data], False
    for start, end in zip(starts, [*starts[1:], len(data)], strict=True):
        stretch = data[start:end]
        first, last = stretch.find(_PROCESSES), stretch.rfind(_END_PROCESSES)
        if first < 0 and last < 0:  # no process list, or <processes />
            parts.append(stretch)
        elif 0 <= first < last:
            names = names or bool(stretch[first + len(_PROCESSES) : last].strip())
            parts.append(stretch[: first + len(_PROCESSES)] + stretch[last:])
        else:
            raise ValueError("a GPU's <processes> element is not closed after it opens")
    if names and len(starts) < attached:
        raise ValueError(
            f"attached_gpus says {attached}, the document opens {len(starts)} GPUs and lists "
            "processes: a process name could have framed a GPU"
        )
    return b"".join(parts)


def _repeated_tag(root: Element) -> str | None:
    """``parent/tag`` of the first tag nvidia-smi prints once that appears twice under one
    parent; None where there is none."""
    for parent in root.iter():
        seen: set[str] = set()
        for child in parent:
            if child.tag in seen and (parent.tag, child.tag) not in REPEATED:
                return f"{parent.tag[:40]}/{child.tag[:40]}"
            seen.add(child.tag)
    return None


def smi_root(data: bytes) -> Element:
    """The ``<nvidia_smi_log>`` element of ``nvidia-smi -q -x``'s output, its process lists
    left empty (``without_process_lists``: no process name reaches the parser; the GPU
    processes are read elsewhere, by pid alone); ValueError for a document with an internal DTD
    or entities, one that is not XML, another root, more GPUs than ``<attached_gpus>``, or a
    tag nvidia-smi prints once under its parent there twice."""
    data = without_process_lists(data)
    try:
        root = fromstring(_SMI_DOCTYPE.sub(rb"\1", data, count=1), forbid_dtd=True)
    except DefusedXmlException as exc:
        raise ValueError(f"XML with a DTD or entities refused ({type(exc).__name__})") from exc
    except (ParseError, LookupError, UnicodeError) as exc:  # LookupError: an unknown encoding
        raise ValueError(f"not XML ({str(exc)[:80]})") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi's XML (root <{root.tag[:40]}>)")
    # The process lists are gone (without_process_lists); what is left is nvidia-smi's own:
    # never more GPUs than it says are attached (fewer: ``-i`` asked for some; a hidden one is
    # below the spec's count), and no tag it prints once twice under one parent.
    attached = (root.findtext("attached_gpus") or "").strip()
    held = len(root.findall("gpu"))
    if not attached.isdigit() or held > int(attached):
        raise ValueError(f"attached_gpus says {attached[:8]!r}, the document holds {held} GPUs")
    if repeated := _repeated_tag(root):
        raise ValueError(f"<{repeated}> appears twice: not nvidia-smi's document")
    return cast(Element, root)


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
