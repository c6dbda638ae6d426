"""The offline judge of a hardware capture (``trainfleet diagnose DIR``): each node folder's
raw sources read as drift reads a live node's (trainfleet/hw), observed and compared with
the same code (the hardware capability, trainfleet.compare), against the majority of the
captured nodes, the health gates and, given a spec, each node's GPU count.

A capture is input from elsewhere: every file is read without following a link, bounded in
size, and anything missing, unreadable or unknown is a ``CaptureError`` naming it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from trainfleet.capabilities import hardware
from trainfleet.compare import Report, compare
from trainfleet.hw.sources import IB_PATH, INFINIBAND, SOURCES, STATUS, STATUS_FILE, read_hardware
from trainfleet.model import Cluster
from trainfleet.schema import short_name_problem

MAX_FILE = 64 * 2**20  # bytes: a whole dmesg or lspci -vvv of a large node is a few MB


class CaptureError(Exception):
    """What is wrong with a capture directory, each problem naming its file."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _read(path: Path, problems: list[str]) -> str | None:
    """A regular file's text (not through a link, at most MAX_FILE bytes), else a problem."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        problems.append(f"{path}: cannot be read ({exc.strerror})")
        return None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            problems.append(f"{path}: not a regular file")
            return None
        data = file.read(MAX_FILE + 1)
    if len(data) > MAX_FILE:
        problems.append(f"{path}: larger than {MAX_FILE} bytes")
        return None
    return data.decode("utf-8", "replace")


def read_node(folder: Path, problems: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """One node folder's ``(status, files)``, as HardwareSources gives them for a live node."""
    status: dict[str, str] = {}
    listing = _read(folder / STATUS_FILE, problems)
    for number, line in enumerate((listing or "").splitlines(), 1):
        name, _, state = line.strip().partition(" ")
        if not line.strip():
            continue
        if name not in SOURCES or not STATUS.fullmatch(state) or name in status:
            problems.append(f"{folder / STATUS_FILE}:{number}: not '<source> <status>': {line!r}")
            continue
        status[name] = state
    if listing is not None and (unsaid := [n for n in SOURCES if n not in status]):
        problems.append(f"{folder / STATUS_FILE}: says nothing of {', '.join(unsaid)}")
    files: dict[str, str] = {}
    for name, state in status.items():
        if state != "ok":
            continue
        if name == INFINIBAND:
            files |= _tree(folder / INFINIBAND, problems)
        elif (text := _read(folder / name, problems)) is not None:
            files[name] = text
    return status, files


def _tree(root: Path, problems: list[str]) -> dict[str, str]:
    """The sysfs tree's files below ``root`` by their path (links are not followed)."""
    if not root.is_dir() or root.is_symlink():
        problems.append(f"{root}: not a directory")
        return {}
    found = {}

    def unreadable(exc: OSError) -> None:
        problems.append(f"{exc.filename}: cannot be read ({exc.strerror})")

    for directory, dirs, names in os.walk(root, onerror=unreadable):
        for name in dirs:
            if (Path(directory) / name).is_symlink():  # os.walk would skip it: a port vanishes
                problems.append(f"{Path(directory) / name}: a link, not a directory")
        for name in names:
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if IB_PATH.fullmatch(relative) and (text := _read(path, problems)) is not None:
                found[f"{INFINIBAND}/{relative}"] = text
    return found


def read_capture(directory: Path) -> dict[str, dict[str, Any]]:
    """``{node: its hardware as plain data}`` from a capture directory (one folder a node)."""
    problems: list[str] = []
    if not directory.is_dir():
        raise CaptureError([f"{directory}: not a directory"])
    nodes = {}
    try:
        folders = sorted(directory.iterdir())
    except OSError as exc:
        raise CaptureError([f"{directory}: cannot be read ({exc.strerror})"]) from exc
    for folder in folders:
        if folder.is_symlink() or not folder.is_dir():
            continue
        if why := short_name_problem(folder.name):  # the spec's grammar for a node's name
            problems.append(f"{folder}: not a node's folder: {why}")
            continue
        status, files = read_node(folder, problems)
        nodes[folder.name] = read_hardware(status, files)
    if not nodes and not problems:
        problems.append(f"{directory}: no node folders (each holds {STATUS_FILE})")
    if problems:
        raise CaptureError(problems)
    return nodes


def judge(directory: Path, cluster: Cluster | None = None) -> Report:
    """The report on a capture: majority, health gates, and the spec's GPU counts when a
    ``cluster`` is given (a node of the spec missing from the capture is named; one the spec
    does not have is an error)."""
    nodes = read_capture(directory)
    if cluster is not None:
        strangers = sorted(set(nodes) - {n.name for n in cluster.nodes})
        if strangers:
            raise CaptureError(
                [f"{directory / name}: not a node of {cluster.name}" for name in strangers]
            )
    names = [n.name for n in cluster.nodes] if cluster else list(nodes)
    observed = {name: hardware.observed(hw) for name, hw in nodes.items()}
    gpus = {n.name: n.gpus for n in cluster.nodes} if cluster else {}
    expected = {name: hardware.expected(gpus.get(name)) for name in nodes}
    missing = {name: "not in the capture" for name in names if name not in nodes}
    title = cluster.name if cluster else directory.resolve().parent.name or str(directory)
    return compare(title, names, observed, expected, missing)
