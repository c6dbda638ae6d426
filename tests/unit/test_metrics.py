"""Prometheus metrics (#42): what a check found, in node_exporter's textfile format, read back
by prometheus_client's own parser; written atomically; a bad path refused before anything runs."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_folded_reports import VBIOS, capture
from trainfleet.compare import Finding, Report
from trainfleet.diagnose import judge
from trainfleet.metrics import (
    pair_bandwidth,
    path_problem,
    report_registry,
    stamp_ages,
    write,
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_captured_clusters_findings_read_back_as_gauges(tmp_path):
    report = judge(capture(tmp_path, 4, {"gpu003": VBIOS}))
    path = tmp_path / "diagnose.prom"
    write(path, report_registry(report, "diagnose", 1_800_000_000.0))
    found = samples(path.read_text())

    def ok(node: str, check: str) -> float:
        labels = (("check", check), ("cluster", report.cluster), ("node", node))
        return found[("trainfleet_node_ok", labels)]

    assert ok("gpu003", "GPU VBIOS") == 0 and ok("gpu001", "GPU VBIOS") == 1
    assert ok("gpu003", "reachable") == 1
    assert all(ok(n, "GPU PCIe link degraded") == 1 for n in ("gpu001", "gpu003"))
    run = (("cluster", report.cluster), ("run", "diagnose"))
    assert found[("trainfleet_findings", (*run[:1], ("kind", "majority"), run[1]))] == 1
    assert found[("trainfleet_nodes", run)] == 4 and found[("trainfleet_odd_nodes", run)] == 1
    assert found[("trainfleet_last_run_timestamp_seconds", run)] == 1_800_000_000.0
    assert not list(tmp_path.glob("*.tmp*")) and not list(tmp_path.glob(".*"))  # no leftovers


def test_an_unreachable_node_and_label_values_that_need_escaping():
    odd = 'odd "name"\\\nline'  # a quote, a backslash and a newline: escaped by prometheus_client
    report = Report(
        'c"1',
        ["n1", "n2"],
        {"n1": {odd: "x"}},
        [Finding("n2", "reachable", "unreachable", "could not connect")],
    )
    found = samples(generate_latest(report_registry(report, "drift", 0)).decode())
    node_ok = "trainfleet_node_ok"
    assert found[(node_ok, (("check", "reachable"), ("cluster", 'c"1'), ("node", "n2")))] == 0
    assert found[(node_ok, (("check", odd), ("cluster", 'c"1'), ("node", "n1")))] == 1
    assert not any(labels[0] == ("check", odd) for name, labels in found if "n2" in str(labels))


def test_the_preflights_pairs_and_stamp_ages(tmp_path):
    report = Report("lab", ["node1", "node2"], {"node1": {}, "node2": {}}, [])
    registry = report_registry(report, "preflight", 1.0)
    pair_bandwidth(registry, "lab", {("node1", "node2"): 0.41})
    stamp_ages(registry, "lab", {"node1": 30.0})
    path = tmp_path / "p.prom"
    write(path, registry)
    found = samples(path.read_text())
    pair = (("a", "node1"), ("b", "node2"), ("cluster", "lab"))
    assert found[("trainfleet_pair_busbw_gbps", pair)] == 0.41
    assert found[("trainfleet_stamp_age_seconds", (("cluster", "lab"), ("node", "node1")))] == 30


def test_a_bad_metrics_path_is_refused_before_the_capture_is_read(tmp_path):
    assert path_problem(str(tmp_path / "x.txt")).endswith("reads only *.prom files")
    assert path_problem(str(tmp_path / "nowhere" / "x.prom")).endswith("no such folder")
    assert path_problem(str(tmp_path / "x.prom")) is None
    run = subprocess.run(
        [sys.executable, "-m", "trainfleet", "diagnose", str(tmp_path / "no-capture")]
        + ["--metrics", str(tmp_path / "nowhere" / "x.prom")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 64 and "--metrics:" in run.stderr and "no such folder" in run.stderr


def test_diagnose_writes_the_metrics_it_was_asked_for(tmp_path):
    root = capture(tmp_path, 3, {"gpu002": VBIOS})
    path = tmp_path / "d.prom"
    run = subprocess.run(
        [sys.executable, "-m", "trainfleet", "diagnose", str(root), "--metrics", str(path)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1, run.stderr  # findings
    ok = {
        (labels[2][1], labels[0][1]): value
        for (name, labels), value in samples(path.read_text()).items()
        if name == "trainfleet_node_ok"
    }
    assert ok[("gpu002", "GPU VBIOS")] == 0 and ok[("gpu001", "GPU VBIOS")] == 1
