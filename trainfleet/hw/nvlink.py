"""``nvidia-smi nvlink -s``: each GPU's NVLinks, active (their speed) or inactive."""

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
