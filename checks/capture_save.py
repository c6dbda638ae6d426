"""A hardware capture: every node's raw hardware sources (one command per node, in
parallel, nothing changed) saved on the controller as files, one folder per node, for
``trainfleet diagnose`` or whoever helps (docs/hardware.md)."""

from __future__ import annotations

import os
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from facts.hardware_facts import HardwareSources
from runtime.gather import gather_fact, once_per_run, refused_sudo
from trainfleet.hw.sources import STATUS_FILE, TREES, is_source, tree_file
from trainfleet.keystore import controller_folder
from trainfleet.model import Cluster


def captures_root(cluster: str) -> Path:
    """``.trainfleet/captures/<cluster>/`` (under TRAINFLEET_HOME when set)."""
    return controller_folder("captures") / cluster


def cluster_capture(cluster: Cluster) -> tuple[Path, dict[str, str]]:
    """Capture every node once per run: (the capture's directory, {node: why it is not
    in it} for the nodes that could not be read)."""
    return once_per_run("hardware capture", lambda state: _capture(state, cluster))


def _capture(state: Any, cluster: Cluster) -> tuple[Path, dict[str, str]]:
    found = gather_fact(state, HardwareSources, mode="capture")
    directory = new_directory(captures_root(cluster.name))
    missing = save_nodes(directory, [n.name for n in cluster.nodes], found, refused_sudo(state))
    print(f"\n--> Hardware capture of {cluster.name}: {directory}", file=sys.stderr)
    for node, why in missing.items():
        print(f"    {node}: not captured ({why})", file=sys.stderr)
    print(f"    judge it: trainfleet diagnose {directory}\n", file=sys.stderr)
    return directory, missing


def save_nodes(
    directory: Path, names: list[str], found: dict[str, Any], refused: dict[str, str]
) -> dict[str, str]:
    """Each node's sources in its folder of ``directory``; {node: why it is not there}. One
    node's output costs that node only: named, its folder removed, every other node saved."""
    missing = {}
    for name in names:
        raw = found.get(name)
        if not raw or not raw["status"]:
            missing[name] = refused.get(name, "could not connect or read it")
            continue
        try:
            write_node(directory / name, raw)
        except (OSError, ValueError) as exc:
            shutil.rmtree(directory / name, ignore_errors=True)
            missing[name] = f"its output could not be saved ({exc})"
    return missing


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


def node_files(raw: dict[str, Any]) -> dict[str, bytes]:
    """One node's files by their path in its folder: the fact's source names (fixed, or
    ``mlnx-qos/<netdev>.txt``), the trees' files (``sys-class-infiniband/``, ``sys-class-net/``,
    ``rdma_cm/`` and the kernel's names, by each tree's grammar, checked again: never
    absolute, never ``..``) and ``sources.txt``. ValueError, naming it, for anything else: an
    unknown name, a path that is another's folder (``mlx5_0/ports`` beside
    ``mlx5_0/ports/1/state``), text that is not text."""
    status, files = raw["status"], raw["files"]
    problems = [f"source {str(n)[:40]!r}" for n in status if not is_source(str(n))]
    for name in files:
        if not isinstance(name, str):
            problems.append(f"file {str(name)[:40]!r}")
        elif not tree_file(name) and (not is_source(name) or name in TREES):
            problems.append(f"file {name[:80]!r}")
    if problems:
        raise ValueError("not a capture's names: " + ", ".join(problems[:4]))
    folders = {str(a) for n in files for a in Path(n).parents}
    if both := sorted(n for n in files if n in folders):
        raise ValueError(f"a file and a folder at once: {both[0][:80]!r}")
    listing = "".join(f"{n} {s}\n" for n, s in status.items())
    try:
        return {n: t.encode("utf-8") for n, t in {**files, STATUS_FILE: listing}.items()}
    except (AttributeError, UnicodeError) as exc:
        raise ValueError(f"a file that is not text ({type(exc).__name__})") from exc


def write_node(folder: Path, raw: dict[str, Any]) -> None:
    """One node's sources as files (``node_files``: every name checked before anything is
    written), and ``sources.txt``: what became of each. Only the controller's user can read
    them (serial numbers, the kernel log)."""
    files = node_files(raw)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for tree in TREES:  # each tree read, even where no file of it was
        if raw["status"].get(tree) == "ok":
            (folder / tree).mkdir(mode=0o700)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(data)
