"""The NVIDIA driver a CUDA pin needs, and how driver versions compare.

NVIDIA's CUDA compatibility guide ("CUDA Toolkit and Minimum Required Driver Version for
CUDA Minor Version Compatibility", docs.nvidia.com/deploy/cuda-compatibility): every CUDA
release of a major version runs on that major's first driver or newer. That is why the
data-center LTS branch R535 carries CUDA 12.4 to 12.9 on real clusters, and why a
toolkit's own bundled driver (550.54.14 for 12.4) is not the floor.
"""

from __future__ import annotations

import re
from types import MappingProxyType

# CUDA major -> the oldest driver that runs every release of it (Linux x86_64).
MIN_DRIVER_FOR_CUDA = MappingProxyType({11: "450.80.02", 12: "525.60.13", 13: "580.65.06"})

_VERSION = re.compile(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", re.ASCII)


def version_key(version: str) -> tuple[int, ...]:
    """A dotted version as numbers, compared part by part: ``550.54.15`` -> (550, 54, 15) (a
    driver), ``12.4`` -> (12, 4) (CUDA)."""
    return tuple(int(part) for part in version.split("."))


def driver_branch(version: str) -> str:
    """``550.54.15`` -> ``550``: the branch a version belongs to."""
    return version.split(".")[0]


def satisfies_driver(installed: str, pin: str) -> bool:
    """An installed driver matches a pin: the same version, or any release of a branch pin."""
    return installed == pin or ("." not in pin and driver_branch(installed) == pin)


def min_driver(cuda: str) -> str | None:
    return MIN_DRIVER_FOR_CUDA.get(int(cuda.split(".")[0]))


def driver_older(driver: str, needed: str) -> bool:
    """``driver`` is older than ``needed``; a branch pin (``550``) installs its newest release,
    so it is older only by branch."""
    have, want = version_key(driver), version_key(needed)
    return have[:1] < want[:1] if len(have) == 1 else have < want


_VARIANT = re.compile(r"cu([0-9]{2,3})([0-9])", re.ASCII)  # cu124: CUDA 12.4, cu130: 13.0


def variant_cuda(variant: str) -> str | None:
    """The CUDA major.minor a torch build's wheels are built for (``cu124`` -> ``12.4``);
    None for one that names none (``cpu``)."""
    match = _VARIANT.fullmatch(variant)
    return f"{int(match[1])}.{match[2]}" if match else None


def driver_for_cuda_problem(driver: str, cuda: str) -> str | None:
    """Why ``driver`` cannot run CUDA ``cuda`` (both named), or None. A branch pin is
    judged by the branch: its newest release is what gets installed."""
    if not _VERSION.fullmatch(driver):
        return f"{driver!r} is not a driver version"
    needed = min_driver(cuda)
    if needed is None:
        return (
            f"CUDA {cuda}: no known minimum driver (trainfleet knows CUDA "
            f"{', '.join(map(str, MIN_DRIVER_FOR_CUDA))})"
        )
    if driver_older(driver, needed):
        return f"driver {driver} is older than CUDA {cuda} needs ({needed} or newer)"
    return None
