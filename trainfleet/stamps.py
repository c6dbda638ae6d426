"""Each node's last preflight verdict, kept on the controller beside the reports: whether it
passed, when, the plan and hardware ledger it passed with, its kernel's GPU error count, and
the causes where it did not. From it come the deploy's healthy subset (a node the last
preflight failed stays left out until one passes it again) and a staleness-bounded preflight's
choice of nodes to re-test. Plain functions over plain data; ``load``/``save`` are the file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainfleet.controller_files import write_atomic
from trainfleet.keystore import controller_folder

# ``--data trainfleet_stale=6h``: a whole number and a unit, seconds to days
STALE = re.compile(r"\A([1-9][0-9]{0,5})([smhd])\Z", re.ASCII)
_UNIT = MappingProxyType({"s": 1, "m": 60, "h": 3600, "d": 86400})
CUT = "left out to keep the subset a multiple of"  # a cause that is the spec's, not the node's


def cut_to_multiple(
    nodes: list[str], multiple_of: int | None
) -> tuple[list[str], dict[str, list[str]]]:
    """``nodes`` cut to a multiple of ``multiple_of`` by leaving out the last ones in rank order:
    (the nodes kept, each one left out -> its cause)."""
    keep = len(nodes) - len(nodes) % multiple_of if multiple_of else len(nodes)
    return nodes[:keep], {node: [f"{CUT} {multiple_of}"] for node in nodes[keep:]}


def stamps_path(cluster: str) -> Path:
    """``.trainfleet/reports/preflight-<cluster>-stamps.json`` (under TRAINFLEET_HOME when set)."""
    return controller_folder("reports") / f"preflight-{cluster}-stamps.json"


def load(cluster: str) -> dict[str, dict[str, Any]]:
    """The stamps by node; none kept yet: empty. A file that cannot be read is an error: a
    deploy must not readmit every node because the record is damaged."""
    path = stamps_path(cluster)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        nodes = json.loads(text)["nodes"]
        if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
            raise ValueError("nodes is not a mapping of node to stamp")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a preflight stamps file ({exc}); move it away") from exc
    return nodes


def save(cluster: str, nodes: Mapping[str, dict[str, Any]]) -> None:
    """Atomically: a unique temp file beside it, then renamed over it."""
    text = json.dumps({"nodes": dict(nodes)}, indent=1, sort_keys=True) + "\n"
    write_atomic(stamps_path(cluster), text)


def parse_stale(value: object) -> timedelta:
    """``6h`` -> 6 hours; anything else is refused with what is accepted."""
    match = STALE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(
            f"{value!r} is not a duration: a whole number and s, m, h or d (30m, 6h, 2d)"
        )
    return timedelta(seconds=int(match.group(1)) * _UNIT[match.group(2)])


def now_text(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except (TypeError, ValueError):
        return None


def passed_at(stamp: Mapping[str, Any]) -> datetime | None:
    """When the node last passed (None: its stamp is no pass, or its time cannot be read)."""
    return _when(stamp.get("at")) if stamp.get("passed") is True else None


def recorded(
    before: Mapping[str, dict[str, Any]],
    tested: Mapping[str, list[str]],
    seen: Mapping[str, Mapping[str, Any]],
    cluster_nodes: list[str],
    now: datetime,
    complete: bool = True,
    figures: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """The stamps after a preflight: each node it tested (``tested``: node -> the causes that
    left it out, empty where none did) stamped now with what it was ``seen`` with (``plan``,
    ``ledger``, ``kernel``); the others kept as they were; nodes gone from the spec dropped.

    A node with causes failed (``passed: False``, left out). One without passed only where the
    run was ``complete`` (the collective ran and passed); else its verdict is open
    (``passed: None``): not left out, but never carried over by a staleness bound. ``figures``:
    what the run measured of each node (its best pair's bus bandwidth and the cluster's median),
    kept with its stamp so a node left out as slow keeps the numbers that left it out."""
    after = {node: dict(stamp) for node, stamp in before.items() if node in cluster_nodes}
    for node, causes in tested.items():
        own = [c for c in causes if not c.startswith(CUT)]
        after[node] = {
            "passed": False if own else True if complete else None,
            "at": now_text(now),
            "causes": own,
            **{key: seen.get(node, {}).get(key) for key in ("plan", "ledger", "kernel")},
        }
        if figures and node in figures:
            after[node]["figures"] = dict(figures[node])
    return after


def exclusions(stamps: Mapping[str, dict[str, Any]], nodes: list[str]) -> dict[str, list[str]]:
    """The nodes of ``nodes`` the last preflight that tested them failed, with its causes."""
    return {
        node: list(stamps[node].get("causes") or ["failed its last preflight"])
        for node in nodes
        if node in stamps and stamps[node].get("passed") is False
    }


def to_retest(
    stamps: Mapping[str, dict[str, Any]],
    seen: Mapping[str, Mapping[str, Any]],
    nodes: list[str],
    bound: timedelta,
    now: datetime,
) -> dict[str, str]:
    """Node -> why it must be tested again, for a preflight bounded by staleness: never passed,
    passed longer ago than ``bound``, or changed since (its plan, its hardware ledger, its
    kernel's GPU error lines or boot); a node whose kernel log could not be read is re-tested
    (a reading that is missing proves nothing; a ledger drift never recorded stays None on both
    sides). The others may carry their verdict over."""
    why = {}
    for node in nodes:
        stamp = stamps.get(node)
        at = _when(stamp.get("at")) if stamp else None
        if not stamp or stamp.get("passed") is not True or at is None:
            why[node] = (
                "never tested"
                if not stamp
                else "did not pass its last preflight"
                if stamp.get("passed") is False
                else "its last preflight ended before its collective passed"
            )
            continue
        if now - at > bound:
            why[node] = f"passed at {stamp['at']}, longer ago than {_text(bound)}"
            continue
        for key, what in (("plan", "its plan"), ("ledger", "its hardware"), ("kernel", "kernel")):
            now_seen = seen.get(node, {}).get(key)
            if key == "kernel" and now_seen is None:
                why[node] = "its kernel's error lines could not be read"
                break
            if now_seen != stamp.get(key):
                why[node] = (
                    f"{what} changed since it passed at {stamp['at']}"
                    if key != "kernel"
                    else f"new GPU error lines in its kernel log (or a reboot) since {stamp['at']}"
                )
                break
    return why


def _text(bound: timedelta) -> str:
    seconds = int(bound.total_seconds())
    for unit in ("d", "h", "m"):
        if seconds % _UNIT[unit] == 0:
            return f"{seconds // _UNIT[unit]}{unit}"
    return f"{seconds}s"
