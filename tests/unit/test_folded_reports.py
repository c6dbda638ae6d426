"""Reports that read at a few hundred nodes (#42): a summary line, then per finding the
property, the odd value and the folded node set that has it; width bounded, length growing with
the findings, not the nodes; the grid only where it fits (or asked for); JSON keeps every node.

Clusters are copies of the project's real H100 capture (tests/fixtures/hardware/h100_device)
with one line changed on one or two nodes, and, at 1,024 nodes, that capture's observed
properties compared as plain data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_hardware import H100, H100_SOURCES
from trainfleet.capabilities import RULES
from trainfleet.compare import Finding, Report, compare
from trainfleet.diagnose import judge
from trainfleet.folded import CELL, WIDTH
from trainfleet.hw.sources import STATUS_FILE
from trainfleet.node_sets import fold

VBIOS = ("nvidia-smi-q.xml", "<vbios_version>96.00.DA.00.0C<", "<vbios_version>96.00.99.00.01<")
WIDTH_X8 = ("nvidia-smi-q.xml", "<current_link_width>16x</", "<current_link_width>8x</")


def capture(tmp: Path, nodes: int, faults: dict[str, tuple[str, str, str]]) -> Path:
    """``nodes`` copies of the H100 node, each ``gpuNNN``; a fault's node gets its own file with
    one line changed. The unchanged files are hard links to the fixture (read-only here: the
    judge never writes), so a 256-node capture costs no copy."""
    root = tmp / "capture"
    for i in range(1, nodes + 1):
        folder = root / f"gpu{i:03d}"
        folder.mkdir(parents=True)
        for name, status in H100_SOURCES.items():
            if status == "ok" and name not in {f[0] for n, f in faults.items() if n == folder.name}:
                os.link(H100 / name, folder / name)
        (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in H100_SOURCES.items()))
    for node, (name, old, new) in faults.items():
        text = (H100 / name).read_text()
        assert text.count(old) == 1, (name, old)
        (root / node / name).write_text(text.replace(old, new))
    return root


def lines_of(report: Report, wide: bool = False) -> list[str]:
    return [*report.table(wide=wide).splitlines(), *report.finding_lines(wide=wide)]


@pytest.mark.parametrize("nodes", [16, 256])
def test_a_captured_cluster_folds_to_its_findings_within_160_columns(tmp_path, nodes):
    faults = {"gpu007": VBIOS, "gpu013": WIDTH_X8}
    report = judge(capture(tmp_path, nodes, faults))
    lines = lines_of(report)
    assert max(map(len, lines)) <= WIDTH, lines
    assert lines[0] == f"{nodes} nodes, 2 odd: gpu[007,013]"
    assert "  gpu007: 96.00.99.00.01 *" in lines
    assert f"  gpu[001-006,008-{nodes:03d}]: 96.00.DA.00.0C" in lines
    assert "  gpu013: GPU 00000000:00:06.0 x8 of x16 *" in lines
    assert "[gpu007] GPU VBIOS is '96.00.99.00.01', the other nodes have '96.00.DA.00.0C'" in lines
    # the same two findings at 16 and at 256 nodes: the length follows the findings
    assert len(lines) == 9, lines
    # JSON keeps every node
    data = json.loads(report.dumps())
    assert len(data["nodes"]) == nodes and data["nodes"]["gpu100" if nodes > 99 else "gpu016"]


def test_the_grid_is_printed_where_it_fits_or_when_asked_and_long_values_are_notes(tmp_path):
    report = judge(capture(tmp_path, 3, {"gpu002": WIDTH_X8}))
    grid = report.table()
    assert grid.splitlines()[0] == "3 nodes, 1 odd: gpu002"
    assert grid.splitlines()[1].split() == ["property", "gpu001", "gpu002", "gpu003"]
    assert report.finding_lines() == [
        "[gpu002] GPU PCIe link degraded: GPU 00000000:00:06.0 x8 of x16"
    ]
    wide = judge(capture(tmp_path / "wide", 40, {"gpu002": WIDTH_X8}))
    assert max(map(len, wide.table().splitlines())) <= WIDTH  # folded
    assert max(map(len, wide.table(wide=True).splitlines())) > WIDTH  # the grid, as asked
    assert wide.table(wide=True).splitlines()[1].startswith("property")


def test_a_long_explanation_never_widens_a_grid_cell():
    long = "the host key changed: " + "x" * 200
    nodes = ["n1", "n2", "n3"]
    observed = {n: {"host key": long if n == "n2" else "ok"} for n in nodes}
    report = Report("c", nodes, observed, [Finding("n2", "host key", "health", long)])
    lines = report.table().splitlines()
    assert lines[3].split() == ["host", "key", "ok", "[1]", "*", "ok"]
    assert max(map(len, lines)) <= WIDTH and all(len(c) <= CELL for c in lines[3].split())
    assert "".join(lines[4:]).replace(" ", "") == ("[1]" + long).replace(" ", "")


def test_a_thousand_nodes_with_two_odd_values_fold_to_a_few_lines(tmp_path):
    one = judge(capture(tmp_path, 1, {})).observed["gpu001"]
    names = [f"gpu{i:04d}" for i in range(1, 1025)]
    observed = {n: dict(one) for n in names}
    observed["gpu0017"]["GPU VBIOS"] = "96.00.99.00.01"
    observed["gpu0131"]["GPU VBIOS"] = "96.00.99.00.01"
    report = compare("big", names, observed, {}, rules=RULES)
    lines = lines_of(report)
    assert max(map(len, lines)) <= WIDTH
    assert lines[:4] == [
        "1024 nodes, 2 odd: gpu[0017,0131]",
        "GPU VBIOS:",
        "  gpu[0017,0131]: 96.00.99.00.01 *",
        "  gpu[0001-0016,0018-0130,0132-1024]: 96.00.DA.00.0C",
    ]
    assert len(lines) == 5


def test_diagnose_prints_the_folded_report_and_the_grid_with_wide(tmp_path):
    root = capture(tmp_path, 64, {"gpu033": VBIOS})
    run = [sys.executable, "-m", "trainfleet", "diagnose", str(root)]
    out = subprocess.run(run, capture_output=True, text=True).stdout
    assert (
        out.splitlines()[0] == "64 nodes, 1 odd: gpu033" and max(map(len, out.splitlines())) <= 160
    )
    wide = subprocess.run([*run, "--wide"], capture_output=True, text=True).stdout
    assert wide.splitlines()[1].split()[:3] == ["property", "gpu001", "gpu002"]


def test_the_preflights_table_folds_at_256_nodes_and_its_problems_fold_by_cause():
    from checks.preflight_report import PreflightReport, Problem

    nodes = [f"gpu{i:03d}" for i in range(1, 257)]
    report = PreflightReport("big", nodes)
    report.stages = {"hygiene": "ok", "reachability": "ok", "bandwidth": "failed"}
    report.problems = [
        Problem("bandwidth", n, "slow: 0.05 GB/s, median 0.40") for n in ("gpu017", "gpu131")
    ]
    lines = [*report.table().splitlines(), *report.problem_lines()]
    assert max(map(len, lines)) <= WIDTH
    assert lines == [
        "256 nodes, 2 odd: gpu[017,131]",
        "hygiene:",
        "  gpu[001-256]: ok",
        "reachability:",
        "  gpu[001-256]: ok",
        "bandwidth:",
        "  gpu[017,131]: FAIL *",
        "  gpu[001-016,018-130,132-256]: ok",
        "[gpu[017,131]] bandwidth: slow: 0.05 GB/s, median 0.40",
    ]
    small = PreflightReport("lab", ["node1", "node2", "node3"], stages={"bandwidth": "failed"})
    small.problems = [Problem("bandwidth", "node3", "slow")]
    assert small.table().splitlines()[1].split() == ["bandwidth", "ok", "ok", "FAIL"]
    assert small.problem_lines() == ["[node3] bandwidth: slow"]


def test_the_preflights_page_shades_each_pair_by_its_fraction_of_the_median():
    from checks.preflight_check import pair_fractions
    from checks.preflight_report import PreflightReport, Problem
    from trainfleet.html_report import heatmap, page

    bandwidth = {
        "pairs": {
            "node1-node2": {"nodes": ["node1", "node2"], "busbw_gbps": 0.4, "of_median": 1.0},
            "node1-node3": {"nodes": ["node1", "node3"], "busbw_gbps": 0.05, "of_median": 0.125},
        }
    }
    fractions = pair_fractions(bandwidth)
    assert fractions == {("node1", "node2"): 1.0, ("node1", "node3"): 0.125}
    report = PreflightReport("lab", ["node1", "node2", "node3"], stages={"bandwidth": "failed"})
    report.problems = [Problem("bandwidth", "node3", "slow")]
    html = page(report.as_report(), "Preflight", heatmap(report.nodes, fractions))
    assert 'title="node1 - node3: 0.12 of the median"' in html
    assert "3 nodes, 1 odd: node3" in html and '<td class="odd" title="FAIL">FAIL</td>' in html


def test_the_rendering_benchmark_measures_each_output_at_each_size():
    from bench.report_render import markdown, measure

    rows = measure([16, 64], runs=1)
    assert [r["nodes"] for r in rows] == [16, 64]
    assert all(r["table lines"] == 4 for r in rows)  # the same two odd values: the same length
    assert rows[1]["page KB"] > rows[0]["page KB"] > 0  # the page holds every node
    assert markdown(rows).splitlines()[0].startswith("| nodes | table s |")


def test_the_healthy_subset_folds_its_node_lists_at_a_few_hundred_nodes():
    from checks.healthy_subset import healthy_lines

    nodes = [f"gpu{i:03d}" for i in range(1, 201)]
    left = {n: ["bandwidth: slow"] for n in nodes[100:112]}
    subset = {"nodes": [n for n in nodes if n not in left], "excluded": left, "note": None}
    lines = healthy_lines(subset, 200)
    assert lines[0].startswith(
        "healthy subset: 188 of 200 nodes, named by no problem: gpu[001-100,113-200] (the next"
    )
    assert lines[1:] == ["left out: gpu[101-112]: bandwidth: slow"]
    assert max(map(len, lines)) <= WIDTH


def test_drift_of_the_benchmarks_256_node_fleet_with_two_hand_edited_hosts_blocks(tmp_path):
    """The controller benchmark's fake fleet (every node answering as a converged one does),
    two nodes' /etc/hosts blocks losing their last line, through drift's own comparison."""
    from bench.controller import fleet as fleet_mod
    from bench.controller.record import load
    from tests.unit.test_controller_bench import hosts_block_cut

    fleet = fleet_mod.build(256, tmp_path / "fleet", load())
    victims = [fleet.cluster.nodes[16].name, fleet.cluster.nodes[130].name]
    answers = hosts_block_cut(fleet, victims)
    report = fleet_mod.offline_drift(fleet, answers)
    lines = [*report.table().splitlines(), *report.finding_lines()]
    assert max(map(len, lines)) <= WIDTH
    assert lines[0] == f"256 nodes, 2 odd: {fold(victims)}"
    assert "hosts block:" in lines
    assert any(line.startswith(f"  {fold(victims)}: ") and line.endswith(" *") for line in lines)
    assert len(lines) < 40  # the findings', not the nodes': 256 nodes would be 256 lines
