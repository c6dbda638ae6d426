"""Which GPUDirect RDMA path a GPU node offers NCCL, from the NVIDIA kernel module's own
``/proc/driver/nvidia/version`` line and the running kernel's release.

DMA-BUF needs the open kernel module (the proprietary one exports no dma-buf for RDMA) and a
kernel with RDMA dma-buf support (Linux 5.12); there NCCL registers GPU memory through
``ibv_reg_dmabuf_mr`` and ``nvidia_peermem`` is not needed (NVIDIA/nccl#1474: deprecated).
Everywhere else GPUDirect RDMA needs ``nvidia_peermem``. A reading that cannot be parsed is
``unknown``, never assumed to be either. Plain functions; no host."""

from __future__ import annotations

import re
from dataclasses import dataclass

DMA_BUF = "DMA-BUF"
PEERMEM = "nvidia_peermem"
UNKNOWN = "unknown"
DMA_BUF_KERNEL = (5, 12)  # ib_umem_dmabuf_get, the kernel's RDMA dma-buf import

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Tue Mar  5 22:42:15 UTC 2024"
_OPEN = re.compile(r"NVRM version: NVIDIA UNIX Open Kernel Module for \S+\s+([0-9][0-9.]*)\s")
_PROPRIETARY = re.compile(r"NVRM version: NVIDIA UNIX \S+ Kernel Module\s+([0-9][0-9.]*)\s")
_KERNEL = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})(?:[.+~-][0-9A-Za-z.+~_-]{0,100})?")


@dataclass(frozen=True)
class GdrPath:
    """The node's path: ``DMA-BUF``, ``nvidia_peermem`` or ``unknown``, and why."""

    kind: str
    module: str | None  # "open" | "proprietary" | None (not read or not parsed)
    kernel: str | None  # the kernel release as read
    why: str  # for people: "open kernel module, kernel 6.8.0-45-generic"
    line: str | None = None  # the version line it was read from

    def value(self) -> str:
        """The drift property's value: ``DMA-BUF (open kernel module, kernel X)``."""
        return f"{self.kind} ({self.why})"


def module_kind(version_line: str | None) -> str | None:
    """``open`` or ``proprietary`` from the version file's first line; None: unparsable."""
    line = (version_line or "").strip() + " "
    if _OPEN.match(line):
        return "open"
    if _PROPRIETARY.match(line):
        return "proprietary"
    return None


def kernel_version(release: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a kernel release (``6.18.44-fc-v657-gpu``); None: unparsable."""
    found = _KERNEL.fullmatch((release or "").strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


def gdr_path(version_line: str | None, release: str | None) -> GdrPath:
    """The GPUDirect RDMA path of a node whose NVIDIA version line and kernel release these
    are (None: not read)."""
    release = None if release is None else release.strip()
    if version_line is None:
        why = "/proc/driver/nvidia/version not read (no NVIDIA driver loaded, or not captured)"
        return GdrPath(UNKNOWN, None, release, why)
    return _from_module(version_line, module_kind(version_line), release)


def _from_module(version_line: str, module: str | None, release: str | None) -> GdrPath:
    if module is None:
        why = f"/proc/driver/nvidia/version unparsable: {version_line.strip()[:80]!r}"
        return GdrPath(UNKNOWN, None, release, why, version_line)
    if module == "proprietary":
        return GdrPath(
            PEERMEM, module, release, "proprietary kernel module: no DMA-BUF", version_line
        )
    kernel = kernel_version(release)
    if kernel is None:
        why = "open kernel module, kernel release " + (
            "not read" if release is None else f"unparsable: {release[:60]!r}"
        )
        return GdrPath(UNKNOWN, module, release, why, version_line)
    if kernel < DMA_BUF_KERNEL:
        why = f"open kernel module, kernel {release} older than 5.12"
        return GdrPath(PEERMEM, module, release, why, version_line)
    return GdrPath(DMA_BUF, module, release, f"open kernel module, kernel {release}", version_line)
