"""The offline judge of a hardware capture (``trainfleet diagnose DIR``): each node folder's
raw sources read as drift reads a live node's (trainfleet/hw), observed and compared with
the same code (the hardware capability, trainfleet.compare), against the majority of the
captured nodes, the health gates and, given a spec, each node's GPU count.

A capture is input from elsewhere: every file is read without following a link, bounded in
size by its source, each node's files and the capture's together bounded too (what was too
large is named, never read whole), and anything missing, unreadable, too large or unknown is a
``CaptureError`` naming it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainfleet.capabilities import RULES, hardware
from trainfleet.compare import HEALTHY, Finding, Report, compare
from trainfleet.diagnose_nccl import add_to_report, capture_readings, envs_of
from trainfleet.grammar import short_name_problem
from trainfleet.hw import infiniband, lspci, pci_tree, topo
from trainfleet.hw.sources import (
    CMDLINE,
    CPUINFO,
    DMESG,
    HCA_PCI,
    INFINIBAND,
    LSPCI,
    NVLINK,
    SMI_XML,
    SOURCES,
    STATUS,
    STATUS_FILE,
    TOPO,
    TREE_PATHS,
    TREES,
    is_source,
    read_hardware,
)
from trainfleet.model import Cluster
from trainfleet.nccl_cluster import odd_rails, rail_values
from trainfleet.rails import (
    HcaPort,
    Rails,
    by_affinity,
    disagreement,
    ports_from_sysfs,
    without_affinity,
)

MiB = 2**20
# The most a capture's file may hold, by source: generous against what a large node prints
# (nvidia-smi -q -x of 8 GPUs: ~250 KB; lspci -vvv of hundreds of functions: a few MB; the
# kernel's log buffer is at most 32 MiB), so that a file past it is not a tool's output.
FILE_LIMITS = MappingProxyType(
    {
        SMI_XML: 16 * MiB,
        NVLINK: 4 * MiB,
        TOPO: 4 * MiB,
        LSPCI: 16 * MiB,
        DMESG: 64 * MiB,
        CMDLINE: 64 * 1024,
        CPUINFO: 16 * MiB,
        STATUS_FILE: 64 * 1024,
    }
)
SYSFS_LIMIT = 64 * 1024  # a sysfs value is one page (4 or 64 KiB)
SMALL_LIMIT = 64 * 1024  # hca-pci.txt, an mlnx_qos output (about 2 KB)
SYSFS_FILES = 16384  # files of one node's InfiniBand tree (an 8-HCA node has ~1500)
NODE_LIMIT = 64 * MiB  # one node's files together: what is held in memory at once
TOTAL_LIMIT = 2048 * MiB  # the capture's files together (a node is a few MB)


class CaptureError(Exception):
    """What is wrong with a capture directory, each problem naming its file."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Budget:
    """What may still be read: of this node's files, and of the capture's."""

    def __init__(self, total: int = TOTAL_LIMIT) -> None:
        self.total, self.node = total, NODE_LIMIT

    def next_node(self) -> None:
        self.node = NODE_LIMIT

    def left(self) -> int:
        return min(self.node, self.total)

    def spent(self) -> str:
        return (
            f"the capture's files pass {TOTAL_LIMIT // MiB} MiB in total"
            if self.total <= self.node
            else f"the node's files pass {NODE_LIMIT // MiB} MiB in total"
        )

    def take(self, size: int) -> None:
        self.node -= size
        self.total -= size


def _read(path: Path, problems: list[str], limit: int, budget: _Budget) -> str | None:
    """A regular file's text (not through a link), else a problem naming it: never more than
    ``limit`` bytes nor what is left of the budget are read (a file larger, by its size or as
    read, is named and not read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        problems.append(f"{path}: cannot be read ({exc.strerror})")
        return None
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{path}: not a regular file")
            return None
        if info.st_size > limit:
            problems.append(f"{path}: {info.st_size} bytes, more than its {limit} (not read)")
            return None
        if info.st_size > budget.left():
            problems.append(f"{path}: not read: {budget.spent()}")
            return None
        data = file.read(min(limit, budget.left()) + 1)
    if len(data) > min(limit, budget.left()):  # it grew since its size was read
        problems.append(f"{path}: more than its {min(limit, budget.left())} bytes (not read)")
        return None
    budget.take(len(data))
    return data.decode("utf-8", "replace")


def read_node(
    folder: Path, problems: list[str], budget: _Budget | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """One node folder's ``(status, files)``, as HardwareSources gives them for a live node,
    each file and all of them bounded (``FILE_LIMITS``, ``NODE_LIMIT``)."""
    budget = budget or _Budget()
    budget.next_node()
    status: dict[str, str] = {}
    listing = _read(folder / STATUS_FILE, problems, FILE_LIMITS[STATUS_FILE], budget)
    for number, line in enumerate((listing or "").splitlines(), 1):
        name, _, state = line.strip().partition(" ")
        if not line.strip():
            continue
        if not is_source(name) or not STATUS.fullmatch(state) or name in status:
            problems.append(f"{folder / STATUS_FILE}:{number}: not '<source> <status>': {line!r}")
            continue
        status[name] = state
    # the fabric's sources (#40) are not in a capture made before them: "not read", not bad
    if listing is not None and (unsaid := [n for n in SOURCES if n not in status]):
        problems.append(f"{folder / STATUS_FILE}: says nothing of {', '.join(unsaid)}")
    files: dict[str, str] = {}
    for name, state in status.items():
        if state != "ok":
            continue
        if name in TREES:
            files |= _tree(folder, name, problems, budget)
        elif "/" in name and (folder / name).parent.is_symlink():
            problems.append(f"{(folder / name).parent}: a link, not a directory")
        elif (
            text := _read(folder / name, problems, FILE_LIMITS.get(name, SMALL_LIMIT), budget)
        ) is not None:
            files[name] = text
    return status, files


def _tree(folder: Path, tree: str, problems: list[str], budget: _Budget) -> dict[str, str]:
    """The files of the tree ``tree`` (sys-class-infiniband, ...) below the node's ``folder``
    by their path (links are not followed; a path outside the tree's grammar is not read), at
    most SYSFS_FILES of them."""
    root = folder / tree
    if not root.is_dir() or root.is_symlink():
        problems.append(f"{root}: not a directory")
        return {}
    found: dict[str, Any] = {}
    seen = 0

    def unreadable(exc: OSError) -> None:
        problems.append(f"{exc.filename}: cannot be read ({exc.strerror})")

    for directory, dirs, names in os.walk(root, onerror=unreadable):
        for name in dirs:
            if (Path(directory) / name).is_symlink():  # os.walk would skip it: a port vanishes
                problems.append(f"{Path(directory) / name}: a link, not a directory")
        for name in names:
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if not TREE_PATHS[tree].fullmatch(relative):
                continue
            if (seen := seen + 1) > SYSFS_FILES:
                problems.append(f"{root}: more than {SYSFS_FILES} files (the rest not read)")
                return found
            if (text := _read(path, problems, SYSFS_LIMIT, budget)) is not None:
                found[f"{tree}/{relative}"] = text
    return found


NCCL_READINGS = "nccl"  # what a node's NCCL environment is derived from (diagnose_nccl)
RAILS = "rails"  # a node's compute rails in read_capture's answer (Rails, a refusal, or None)
RAILS_PROPERTY = "NCCL_IB_HCA (compute rails)"
RAILS_HEALTH = "NCCL rails problems"


def node_rails(status: dict[str, str], files: dict[str, str]) -> Rails | str | None:
    """The node's compute rails from its capture (docs/nccl_env.md): by GPU affinity where
    ``topo -m`` was read, else where ``lspci -vvv`` and ``hca-pci.txt`` were (a node without
    nvidia-smi), with the sysfs tree's ports where that was read too; where both affinity
    sources were read, topo -m decides and their difference is named; with neither, from the
    sysfs tree alone; an affinity source that cannot be read: why (never a guess); no source at
    all: None (nothing to derive)."""
    ports = None
    if status.get(INFINIBAND) == "ok":
        prefix = INFINIBAND + "/"
        tree = {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}
        ports = ports_from_sysfs(infiniband.hcas(tree))
    from_lspci = _lspci_rails(status, files, ports)
    if status.get(TOPO) == "ok" and TOPO in files:
        try:
            rails = by_affinity(topo.parse(files[TOPO]), ports)
        except topo.TopoRefused as exc:
            return f"nvidia-smi topo -m refused: {exc}"
        return replace(rails, notes=(*rails.notes, *_second_opinion(rails, from_lspci)))
    if from_lspci is not None:
        return from_lspci
    return None if ports is None else without_affinity(ports)


def _second_opinion(by_topo: Rails, from_lspci: Rails | str | None) -> tuple[str, ...]:
    """What lspci's rails say beside topo -m's, which decide: where they differ by HCA, and
    what stood in lspci's way (an unreadable hca-pci.txt, an HCA lspci lacks), named."""
    if from_lspci is None:
        return ()
    if isinstance(from_lspci, str):
        return (from_lspci,)
    if not (by_topo.rails and from_lspci.rails):
        return from_lspci.problems
    return (*from_lspci.problems, *disagreement(by_topo, from_lspci))


def _lspci_rails(
    status: dict[str, str], files: dict[str, str], ports: list[HcaPort] | None
) -> Rails | str | None:
    """The rails by lspci's PCIe switches and each HCA's PCI function (None: either source
    not read, or a node whose lspci shows no GPU); a source that cannot be read: why."""
    if status.get(HCA_PCI) != "ok" or status.get(LSPCI) != "ok" or LSPCI not in files:
        return None
    try:
        functions = pci_tree.hca_functions(files.get(HCA_PCI, ""))
    except ValueError as exc:
        return f"{HCA_PCI} refused: {exc}"
    devices = lspci.devices(files[LSPCI])
    if not any(lspci.is_gpu(d) for d in devices):
        return None
    topology, missing = pci_tree.lspci_topology(devices, functions)
    rails = by_affinity(topology, ports)
    return replace(rails, problems=(*missing, *rails.problems)) if missing else rails


def _rails_findings(report: Report, rails: dict[str, Rails | str | None]) -> None:
    """Each node's NCCL_IB_HCA and rails as observed (so the table shows what a finding is
    on), what stands in the way of its list as a finding, and the nodes whose rails differ
    from the majority's, each named with the rail."""
    derived = {name: r for name, r in rails.items() if isinstance(r, Rails)}
    for name, found in rails.items():
        if found is None or found == Rails((), {}, (), by_affinity=True):
            continue  # a GPU with no NIC at all (topo -m lists none, no HCA): nothing to show
        observed = report.observed.setdefault(name, {})
        if isinstance(found, str):
            blockers = [found]
        else:
            blockers = [*found.problems, *([found.mixed] if found.mixed else []), *found.notes]
            observed[RAILS_PROPERTY] = found.hca_list if found.rails else "none (NCCL_IB_DISABLE=1)"
            observed |= rail_values(found)
        observed[RAILS_HEALTH] = "; ".join(blockers) or HEALTHY
        if blockers:
            report.findings.append(
                Finding(name, RAILS_HEALTH, "health", "; ".join(blockers), HEALTHY)
            )
    report.findings += odd_rails(derived)
    order = {n: i for i, n in enumerate(report.nodes)}
    report.findings.sort(key=lambda f: (order.get(f.node, len(order)), f.property))


def read_capture(directory: Path) -> dict[str, dict[str, Any]]:
    """``{node: its hardware as plain data}`` from a capture directory (one folder a node)."""
    problems: list[str] = []
    if not directory.is_dir():
        raise CaptureError([f"{directory}: not a directory"])
    nodes, budget = {}, _Budget()
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
        status, files = read_node(folder, problems, budget)
        nodes[folder.name] = read_hardware(status, files)
        nodes[folder.name][RAILS] = node_rails(status, files)
        nodes[folder.name][NCCL_READINGS] = capture_readings(status, files)
        del files  # one node's text held at a time: only what its parsers keep stays
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
    compared = compare(title, names, observed, expected, missing, rules=RULES)
    if cluster is None:
        compared.compared_with = (
            "each other and pass the health gates (no spec given: GPU counts not checked)"
        )
    _rails_findings(compared, {name: hw[RAILS] for name, hw in nodes.items()})
    add_to_report(
        compared,
        envs_of(
            {name: hw[RAILS] for name, hw in nodes.items()},
            {name: hw[NCCL_READINGS] for name, hw in nodes.items()},
            cluster,
        ),
    )
    return compared
