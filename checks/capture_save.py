"""A hardware capture: every node's raw hardware sources (one command per node, in
parallel, nothing changed) saved on the controller as files, one folder per node, for
``trainfleet diagnose`` or whoever helps (docs/hardware.md)."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from facts.hardware_facts import HardwareSources
from runtime.gather import gather_fact, once_per_run, refused_sudo
from trainfleet.hw.sources import INFINIBAND, STATUS_FILE
from trainfleet.keystore import store_root
from trainfleet.model import Cluster


def captures_root(cluster: str) -> Path:
    """``.trainfleet/captures/<cluster>/`` (under TRAINFLEET_HOME when set)."""
    return store_root().parent / "captures" / cluster


def cluster_capture(cluster: Cluster) -> tuple[Path, dict[str, str]]:
    """Capture every node once per run: (the capture's directory, {node: why it is not
    in it} for the nodes that could not be read)."""
    return once_per_run("hardware capture", lambda state: _capture(state, cluster))


def _capture(state: Any, cluster: Cluster) -> tuple[Path, dict[str, str]]:
    found = gather_fact(state, HardwareSources, mode="capture")
    refused = refused_sudo(state)
    directory = new_directory(captures_root(cluster.name))
    missing = {}
    for node in cluster.nodes:
        raw = found.get(node.name)
        if not raw or not raw["status"]:
            missing[node.name] = refused.get(node.name, "could not connect or read it")
            continue
        write_node(directory / node.name, raw)
    print(f"\n--> Hardware capture of {cluster.name}: {directory}", file=sys.stderr)
    for node, why in missing.items():
        print(f"    {node}: not captured ({why})", file=sys.stderr)
    print(f"    judge it: trainfleet diagnose {directory}\n", file=sys.stderr)
    return directory, missing


def new_directory(parent: Path) -> Path:
    """``parent/<UTC time>``, made now and only the controller user's (a second capture in the
    same second gets ``-2``, ``-3``...)."""
    parent.mkdir(parents=True, exist_ok=True)
    when = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%SZ")
    for n in range(1, 100):
        directory = parent / (when if n == 1 else f"{when}-{n}")
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return directory
    raise FileExistsError(f"{parent / when}: 99 captures in one second")


def write_node(folder: Path, raw: dict[str, Any]) -> None:
    """One node's sources as files (the fact's names: its fixed source names and the kernel's
    sysfs names, checked there), and ``sources.txt``: what became of each. Only the
    controller's user can read them (serial numbers, the kernel log)."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if raw["status"].get(INFINIBAND) == "ok":  # the tree, even where no file of it was read
        (folder / INFINIBAND).mkdir(mode=0o700)
    listing = "".join(f"{n} {s}\n" for n, s in raw["status"].items())
    for name, text in {**raw["files"], STATUS_FILE: listing}.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
