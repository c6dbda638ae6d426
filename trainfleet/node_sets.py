"""Node sets, as Slurm, pdsh and ClusterShell write them: ``gpu[001-200]``,
``rack[1-2]-gpu[01-16]``, ``192.0.2.[1-200]``; expanded for the spec and folded for reports by
ClusterShell's ``NodeSet`` (groups off: a name never reads a group file).

A node set in the spec is one pattern: names of letters, digits, dots and dashes with bracketed
ranges of numbers (``[001-016,020]``), no operators (``,`` ``!`` ``&`` ``^`` between sets) and no
``@group``. Its size is computed from the text before ClusterShell expands it (``NodeSet`` builds
every name at once: ``gpu[1-999999999]`` would take the controller's memory), and refused over
``MAX_NODES``."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable

MAX_NODES = 4096  # more than a spec of a few hundred nodes needs; bounded before expansion
_RANGE = r"[0-9]{1,9}(?:-[0-9]{1,9})?"
_GROUP = rf"\[{_RANGE}(?:,{_RANGE})*\]"
_PATTERN = re.compile(rf"(?:[A-Za-z0-9.-]|{_GROUP})+")


def is_node_set(text: str) -> bool:
    """Whether a spec's name or address is written as a node set (it has a bracket)."""
    return "[" in text or "]" in text


def size_problem(text: str) -> str | None:
    """What is wrong with ``text`` as a node set pattern, or None (nothing is expanded)."""
    if len(text) > 253 or not _PATTERN.fullmatch(text):
        return (
            "not a node set: letters, digits, dots and dashes with bracketed ranges of numbers "
            "(gpu[001-200], rack[1-2]-gpu[01-16])"
        )
    count = 1
    for group in re.findall(_GROUP, text):
        members = 0
        for item in group[1:-1].split(","):
            low, _, high = item.partition("-")
            if high and int(high) < int(low):
                return f"range {item} runs backwards"
            if high and len(low) != len(high) and low.startswith("0"):
                return f"range {item}: padded bounds of different widths"
            members += int(high or low) - int(low) + 1
        count = math.prod((count, members))
        if count > MAX_NODES:
            return f"expands to more than {MAX_NODES} names"
    return None


def expand(text: str) -> list[str]:
    """The names of a pattern ``size_problem`` accepted, in ClusterShell's order; ValueError
    where ClusterShell refuses it (overlapping ranges, ...)."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

    if problem := size_problem(text):
        raise ValueError(problem)
    try:
        return [str(name) for name in NodeSet(text, resolver=RESOLVER_NOGROUP)]
    except NodeSetException as exc:
        raise ValueError(f"not a node set: {exc}") from None


def count_up(first: str, count: int) -> list[str]:
    """``count`` addresses from ``first`` upwards; ValueError where they would leave the
    first address's /24 (IPv4) or /64 (IPv6), or reach its last address (a broadcast)."""
    address = ipaddress.ip_address(first)
    network = ipaddress.ip_network(f"{address}/{24 if address.version == 4 else 64}", strict=False)
    last = address + (count - 1)
    if last not in network or last == network.broadcast_address:
        raise ValueError(
            f"{count} addresses counted up from {first} leave its subnet {network}: give a "
            "range that stays in one subnet (192.0.2.[1-200]) or split the entry"
        )
    return [str(address + i) for i in range(count)]


def fold(names: Iterable[str]) -> str:
    """The names as one folded node set: ``gpu[001-016,018]``."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

    return str(NodeSet.fromlist(list(names), resolver=RESOLVER_NOGROUP))
