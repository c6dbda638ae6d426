"""``nvidia-smi nvlink -s``: each GPU's NVLinks, active (their speed) or inactive; ``nvidia-smi
nvlink -e``: each link's error counters."""

from __future__ import annotations

import re

_GPU = re.compile(r"GPU ([0-9]{1,3}): ")
_LINK = re.compile(r"Link ([0-9]{1,3}): (.+)")


def links(text: str) -> dict[int, dict[int, str]]:
    """``{gpu index: {link: "26.562 GB/s" | "<inactive>"}}``; a GPU without NVLinks has none."""
    found: dict[int, dict[int, str]] = {}
    gpu: dict[int, str] | None = None
    for line in text.splitlines():
        if head := _GPU.match(line):
            gpu = found.setdefault(int(head.group(1)), {})
        elif gpu is not None and (link := _LINK.fullmatch(line.strip())):
            gpu[int(link.group(1))] = link.group(2).strip()
    return found


# "Link 0: Replay Errors: 0", "Link 0: CRC Errors: 0" (newer drivers print more names)
_ERRORS = re.compile(r"Link ([0-9]{1,3}): ([A-Za-z][A-Za-z0-9 ._()-]{0,63}?): ([0-9]{1,20})")


def error_counters(text: str) -> dict[tuple[int, int, str], int]:
    """``{(gpu index, link, counter name): value}`` from ``nvidia-smi nvlink -e``; a GPU without
    NVLinks has none."""
    found: dict[tuple[int, int, str], int] = {}
    gpu: int | None = None
    for line in text.splitlines():
        if head := _GPU.match(line):
            gpu = int(head.group(1))
        elif gpu is not None and (counter := _ERRORS.fullmatch(line.strip())):
            found[(gpu, int(counter.group(1)), counter.group(2))] = int(counter.group(3))
    return found
