"""Text from nodes made safe to show: printable ASCII only."""

from __future__ import annotations


def printable(text: str, limit: int = 200) -> str:
    """``text`` with anything but printable ASCII escaped (no terminal control sequences)."""
    return "".join(
        c if " " <= c <= "~" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
        for c in text[:limit]
    )
