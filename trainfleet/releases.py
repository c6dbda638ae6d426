"""Releases that exist, for the spec's version pins: a value of the right shape that names no
release (CUDA 12.7, torch 2.4.9) is refused before any host, not found out by a package
manager on every node. Known releases only: a version newer than every one listed here is
accepted (this file cannot know the future), a gap inside what it knows is refused.

Sources: NVIDIA's CUDA Toolkit Archive (developer.nvidia.com/cuda-toolkit-archive: 12.6 is
followed by 12.8, there is no 12.7), PyTorch's release list (github.com/pytorch/pytorch/releases).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from trainfleet.driver_pins import version_key

# CUDA toolkit releases, major.minor
CUDA: tuple[str, ...] = (
    "9.0", "9.1", "9.2", "10.0", "10.1", "10.2",
    "11.0", "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "11.7", "11.8",
    "12.0", "12.1", "12.2", "12.3", "12.4", "12.5", "12.6", "12.8", "12.9",
    "13.0",
)  # fmt: skip

# PyTorch: each minor's patch releases (a minor newer than these is not judged)
TORCH: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {
        "2.0": (0, 1), "2.1": (0, 1, 2), "2.2": (0, 1, 2), "2.3": (0, 1), "2.4": (0, 1),
        "2.5": (0, 1), "2.6": (0,), "2.7": (0, 1), "2.8": (0,), "2.9": (0, 1),
    }
)  # fmt: skip


def cuda_problem(value: str) -> str | None:
    """A CUDA major.minor inside the known releases that is not one of them."""
    minor = ".".join(value.split(".")[:2])
    key = version_key(minor)
    if minor in CUDA or not version_key(CUDA[0]) < key < version_key(CUDA[-1]):
        return None
    before = max((v for v in CUDA if version_key(v) < key), key=version_key)
    after = min((v for v in CUDA if version_key(v) > key), key=version_key)
    return f"CUDA {minor} was never released ({before} is followed by {after})"


def torch_problem(value: str) -> str | None:
    """A torch release whose minor is known but whose patch release is not one of its own."""
    base = value.split("+", 1)[0]
    major, minor, patch = base.split(".")
    releases = TORCH.get(f"{major}.{minor}")
    if releases is None or int(patch) in releases:
        return None
    have = ", ".join(f"{major}.{minor}.{p}" for p in releases)
    return f"torch {base} was never released (torch {major}.{minor} has {have})"
