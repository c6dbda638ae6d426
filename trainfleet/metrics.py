"""Prometheus metrics of a check's report, in node_exporter's textfile format: a monitoring
system scrapes what drift, the preflight and diagnose found, as it scrapes node_exporter's
textfile collector or DCGM's exporter. Rendered by prometheus_client itself (its own escaping of
label values, which hold node and property names), written atomically beside the JSON.

- ``trainfleet_node_ok{cluster,node,check}``: 1 where the node passes the check (a property
  drift compares, a preflight stage), 0 where a finding is on it; a node that could not be read
  has ``check="reachable"`` 0;
- ``trainfleet_findings{cluster,run,kind}``: the findings by kind (spec, majority, health, ...);
- ``trainfleet_nodes{cluster,run}`` and ``trainfleet_odd_nodes{cluster,run}``;
- ``trainfleet_last_run_timestamp_seconds{cluster,run}``: when the check ran;
- the preflight adds ``trainfleet_pair_busbw_gbps{cluster,a,b}`` and
  ``trainfleet_stamp_age_seconds{cluster,node}``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from trainfleet.compare import Report
from trainfleet.controller_files import write_atomic

REACHABLE = "reachable"


def report_registry(report: Report, run: str, when: float) -> CollectorRegistry:
    """A registry holding ``report``'s metrics (``run``: drift, preflight or diagnose)."""
    registry = CollectorRegistry()
    ok = Gauge(
        "trainfleet_node_ok",
        "1 where the node passes the check, 0 where a finding is on it",
        ["cluster", "node", "check"],
        registry=registry,
    )
    odd = {(f.node, f.property) for f in report.findings}
    unreachable = {f.node for f in report.findings if f.kind == "unreachable"}
    for node in report.nodes:
        if node in unreachable or node not in report.observed:
            ok.labels(report.cluster, node, REACHABLE).set(0)
            continue
        ok.labels(report.cluster, node, REACHABLE).set(1)
        checks = set(report.observed[node]) | {p for n, p in odd if n == node}
        for prop in sorted(checks):
            ok.labels(report.cluster, node, prop).set(0 if (node, prop) in odd else 1)
    findings = Gauge(
        "trainfleet_findings",
        "findings of the last run, by kind",
        ["cluster", "run", "kind"],
        registry=registry,
    )
    for kind, count in Counter(f.kind for f in report.findings).items():
        findings.labels(report.cluster, run, kind).set(count)
    for name, help_text, value in (
        ("trainfleet_nodes", "nodes the run looked at", len(report.nodes)),
        ("trainfleet_odd_nodes", "nodes with a finding", len({f.node for f in report.findings})),
        ("trainfleet_last_run_timestamp_seconds", "when the run ended (Unix time)", when),
    ):
        Gauge(name, help_text, ["cluster", "run"], registry=registry).labels(
            report.cluster, run
        ).set(value)
    return registry


def pair_bandwidth(
    registry: CollectorRegistry, cluster: str, pairs: Mapping[tuple[str, str], float]
) -> None:
    """Each node pair's measured bus bandwidth (the preflight's bandwidth stage)."""
    gauge = Gauge(
        "trainfleet_pair_busbw_gbps",
        "bus bandwidth a node pair measured in the preflight, GB/s",
        ["cluster", "a", "b"],
        registry=registry,
    )
    for (a, b), gbps in pairs.items():
        gauge.labels(cluster, a, b).set(gbps)


def stamp_ages(registry: CollectorRegistry, cluster: str, ages: Mapping[str, float]) -> None:
    """Seconds since each node last passed the preflight (its stamp)."""
    gauge = Gauge(
        "trainfleet_stamp_age_seconds",
        "seconds since the node last passed the preflight",
        ["cluster", "node"],
        registry=registry,
    )
    for node, age in ages.items():
        gauge.labels(cluster, node).set(age)


def write(path: Path, registry: CollectorRegistry) -> None:
    """The registry in the textfile format, written atomically (a scrape never sees half)."""
    write_atomic(path, generate_latest(registry))


def path_problem(value: object) -> str | None:
    """What is wrong with a metrics path before any host is touched: its folder must exist, and
    the name end in ``.prom`` (node_exporter's textfile collector reads only those)."""
    if not isinstance(value, str) or not value:
        return "give a file path"
    path = Path(value)
    if path.suffix != ".prom":
        return f"{value}: node_exporter's textfile collector reads only *.prom files"
    if not path.parent.is_dir():
        return f"{path.parent}: no such folder"
    return None
