"""The kernel command line (``/proc/cmdline``): the IOMMU settings peer-to-peer depends on;
``/proc/cpuinfo``: whether the CPU runs under a hypervisor."""

from __future__ import annotations

_IOMMU = ("intel_iommu=", "amd_iommu=", "iommu=", "iommu.passthrough=", "iommu.strict=")


def iommu(cmdline: str) -> list[str]:
    """The IOMMU parameters, in order (empty: the kernel's default)."""
    return [word for word in cmdline.split() if word.startswith(_IOMMU)]


def hypervisor_flag(cpuinfo: str) -> bool:
    """The ``hypervisor`` CPU flag (x86: set by every hypervisor for its guests)."""
    return any(
        line.startswith("flags") and "hypervisor" in line.partition(":")[2].split()
        for line in cpuinfo.splitlines()
    )
