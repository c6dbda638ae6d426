"""The preflight: prove the cluster can train, stage by stage, each with a hard time bound.

Stages run on every node at once from the controller (one command per node per stage, see
``checks.stage_runner``; the bandwidth stage's pairs run in the collective's command, by the
same processes, so torch is imported once per rank); every remote process is wrapped in
``timeout`` so nothing outlives its stage even if the controller is interrupted. Each stage is
a module of its own (``checks/<stage>_stage.py``), its verdicts plain functions in
``checks/<stage>_verdicts.py``.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyinfra import logger
from pyinfra.api import State

from checks.bandwidth_stage import (
    bandwidth_jobs,
    bandwidth_lines,
    bandwidth_plan,
    judge_bandwidth,
    read_error_counters,
    watched_nodes,
)
from checks.bandwidth_verdicts import node_figures
from checks.collective_stage import backend_of, run_collective, run_isolation
from checks.collective_verdicts import failed_before_the_network, missing_interfaces
from checks.drift_check import read_ledger
from checks.healthy_subset import healthy_lines, healthy_subset
from checks.hygiene_stage import run_hygiene
from checks.hygiene_verdicts import pair_port_problems
from checks.mesh_stage import run_ssh_mesh
from checks.pair_ports import hosted_ports
from checks.preflight_report import PreflightReport, Problem
from checks.preflight_scope import bound_line, scope, seen_now, worst_case
from checks.publish import publish
from checks.publish import report_path as report_file
from checks.reachability_stage import run_reachability
from checks.reachability_verdicts import reachability_failed
from checks.smoke_stage import run_smoke
from checks.stage_runner import BOUNDS
from runtime.gather import once_per_run, prove_sudo, refused_sudo
from trainfleet import html_report, stamps
from trainfleet import metrics as prometheus
from trainfleet.controller_files import write_atomic
from trainfleet.model import Cluster


def cluster_preflight(
    cluster: Cluster,
    smoke: str | None = None,
    stale: timedelta | None = None,
    metrics: Path | None = None,
) -> PreflightReport:
    """Run every stage once per run, print the table and write the JSON report and the stamps.

    + smoke: also train the smoke job through this launcher (``SMOKE_LAUNCHERS``)
    + stale: test again only the nodes whose last pass is older than this, or changed since,
      or that never passed (``checks.preflight_scope.scope``); the others carry their verdict
    """
    return once_per_run("preflight", lambda state: _run(state, cluster, smoke, stale, metrics))


def _run(
    state: State,
    cluster: Cluster,
    smoke: str | None = None,
    stale: timedelta | None = None,
    metrics: Path | None = None,
) -> PreflightReport:
    steps = worst_case(cluster, smoke)
    print(f"--> Preflight of {cluster.name}: {bound_line(cluster, steps)}", file=sys.stderr)
    report = PreflightReport(cluster=cluster.name, nodes=[n.name for n in cluster.nodes])
    report.details["bound"] = {"seconds": sum(steps.values()), "steps": steps}
    prove_sudo(
        state, list(state.inventory.get_active_hosts())
    )  # before any stage runs through sudo
    refused = refused_sudo(state)
    active = {h.data.trainfleet_node for h in state.inventory.get_active_hosts()}
    for node in cluster.nodes:
        if node.name in refused:
            report.problems.append(Problem("unreachable", node.name, refused[node.name]))
        elif node.name not in active:
            report.problems.append(Problem("unreachable", node.name, "cannot be reached over SSH"))
    networks, plan = run_hygiene(state, cluster, report)
    no_interface = missing_interfaces(
        report.details["hygiene"], networks, backend_of(cluster)
    )  # their ranks cannot start: the collective is not run (_stages)
    report.problems += [Problem("hygiene", node, why) for node, why in no_interface.items()]
    report.stages["hygiene"] = (
        "failed" if any(p.stage == "hygiene" for p in report.problems) else "ok"
    )
    now = datetime.now(UTC)
    recorded = stamps.load(cluster.name)
    seen = seen_now(
        cluster,
        plan,
        report.details["hygiene"],
        read_ledger(cluster.name, logger.warning),
    )
    tested = cluster
    if stale is not None:
        failed = {p.node for p in report.problems}
        names, report.retested, report.carried = scope(cluster, recorded, seen, stale, now, failed)
        tested = cluster.subset(names)
    if tested.nodes:
        _stages(state, tested, report, networks, active & {n.name for n in tested.nodes}, smoke)
    if not tested.nodes:  # every node carried its verdict over: no stage after hygiene ran
        for stage in ("reachability", "ssh", "collective", "bandwidth"):
            if stage != "ssh" or cluster.mesh_users:
                report.stages[stage] = "carried over"
    report.healthy = healthy_subset(
        report.nodes, report.problems, cluster.preflight.get("healthy_multiple_of")
    )
    # Stamped: the nodes of this run (not those a --limit left out) that it tested or named.
    in_run = {h.data.trainfleet_node for h in state.inventory if state.is_host_in_limit(h)}
    stamped = ({n.name for n in tested.nodes} | {p.node for p in report.problems}) & in_run
    stamps.save(
        cluster.name,
        stamps.recorded(
            recorded,
            {n: report.healthy["excluded"].get(n, []) for n in report.nodes if n in stamped},
            seen,
            report.nodes,
            now,
            complete=complete(report, tested),
            figures=node_figures(report.details.get("bandwidth", {})),
        ),
    )
    _publish(report)
    _pictures(report, metrics, now)
    return report


def _stages(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    networks: dict[str, Any],
    active: set[str],
    smoke: str | None,
) -> None:
    """The stages after hygiene, on the nodes tested (a staleness bound tests a subset)."""
    master_port_free = not report.details["hygiene"].get(cluster.master.name, {}).get("port_holder")
    run_reachability(state, cluster, report, master_port_free)
    report.stages["reachability"] = (
        "failed" if any(p.stage == "reachability" for p in report.problems) else "ok"
    )
    if cluster.mesh_users:
        run_ssh_mesh(state, cluster, report, active)
        report.stages["ssh"] = "failed" if any(p.stage == "ssh" for p in report.problems) else "ok"
    # A collective cannot succeed where a node cannot be reached (over SSH, a peer's listener or
    # the rendezvous port) or a node's ranks cannot start: not run, the cause is named above.
    unreached = reachability_failed(report.details.get("reachability", {}))
    no_interface = missing_interfaces(
        report.details["hygiene"], networks, backend_of(cluster)
    ).keys() & {n.name for n in cluster.nodes}
    if len(active) < len(cluster.nodes) or not master_port_free or unreached or no_interface:
        report.stages["collective"] = "skipped"
        report.stages["bandwidth"] = "skipped"
    else:
        _collective_stages(state, cluster, report, networks, active)
    if smoke:
        if report.carried:
            report.stages["smoke"] = "skipped"  # the launch files start every node, not a subset
        elif report.stages.get("collective") == "ok":
            run_smoke(state, cluster, report, smoke)
            report.stages["smoke"] = (
                "failed" if any(p.stage == "smoke" for p in report.problems) else "ok"
            )
        else:
            report.stages["smoke"] = "skipped"  # no launcher can train where the collective failed


def _collective_stages(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    networks: dict[str, Any],
    active: set[str],
) -> None:
    """The collective, and in the same command and processes the bandwidth stage's pairs (run
    only where the collective passed); when the collective fails for a link's sake, isolation;
    when it passes, the pairs are judged. The error counters are read before the command and
    after it."""
    # a pair's port already held (named by hygiene): no pair runs, nor is one named for it
    held = pairs_held(report, cluster)
    rounds, _ = bandwidth_plan(cluster) if not held else ([], None)
    watched = watched_nodes(cluster, networks) if rounds else []
    before = read_error_counters(state, watched)
    pairs = bandwidth_jobs(cluster, rounds, BOUNDS["collective"], BOUNDS["bandwidth"])
    finished, ranks = run_collective(state, cluster, report, networks, pairs)
    mine = [p for p in report.problems if p.stage == "collective"]
    report.stages["collective"] = "failed" if mine else "ok"
    joined_all = not any("never joined" in p.cause for p in report.problems)
    # The same error on every rank is the venv's or the script's, not a link's; so is a rank
    # that failed before the network (no venv, no torch), whose own words are named already.
    same_everywhere = len({p.cause for p in mine}) == 1 and len(mine) == len(active)
    on_their_own = {p.node for p in mine} <= failed_before_the_network(
        report.details["collective"]["steps"]
    )
    if (
        not finished
        and joined_all
        and not same_everywhere
        and not on_their_own
        and len(cluster.nodes) > 2
        and not held
    ):
        run_isolation(state, cluster, report)
        report.stages["isolation"] = (
            "failed" if any(p.stage == "isolation" for p in report.problems) else "ok"
        )
    if finished and not held:  # (NCCL over sockets is measured too: what it costs)
        judge_bandwidth(state, cluster, report, ranks, before, watched)
    else:
        report.stages["bandwidth"] = "skipped"


def complete(report: PreflightReport, tested: Cluster) -> bool:
    """Whether a node no problem names passed: only where the collective ran and passed with it,
    a healthy subset was found, and no pair was skipped for a held port (those pairs never ran:
    nobody passed them, so nobody may carry a pass over a staleness bound)."""
    return (
        report.stages.get("collective") == "ok"
        and not report.healthy["note"]
        and not (tested.nodes and pairs_held(report, tested))
    )


def pairs_held(report: PreflightReport, cluster: Cluster) -> bool:
    """Whether hygiene found a port that one of ``cluster``'s pairs would host held: then no
    pair runs (fails closed: the bandwidth stage and the isolation test nobody)."""
    return bool(pair_port_problems(report.details.get("hygiene", {}), hosted_ports(cluster)))


def report_path(cluster: str) -> Path:
    return report_file("preflight", cluster)


def _publish(result: PreflightReport) -> None:
    # the node x stage grid even where it does not fit 160 columns (else it folds)
    wide = os.environ.get("TRAINFLEET_WIDE") == "1"
    lines = bandwidth_lines(result.details.get("bandwidth", {}))
    lines += result.problem_lines(wide)
    if result.carried:
        lines.append(
            "carried over (passed within the staleness bound, unchanged): "
            + ", ".join(f"{node} (passed at {at})" for node, at in result.carried.items())
        )
    lines += [f"[{node}] tested again: {why}" for node, why in result.retested.items()]
    lines += healthy_lines(result.healthy, len(result.nodes))
    if result.ok:
        lines.append("the cluster can train: every stage passed")
    publish(
        f"Preflight for {result.cluster}",
        result.table(wide),
        lines,
        result.dumps(),
        report_path(result.cluster),
        "TRAINFLEET_PREFLIGHT_JSON",
    )


def pair_fractions(bandwidth: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Each measured pair's bus bandwidth as a fraction of the cluster's median."""
    return {
        (pair["nodes"][0], pair["nodes"][1]): pair["of_median"]
        for pair in bandwidth.get("pairs", {}).values()
        if pair.get("of_median") is not None and len(pair.get("nodes", ())) == 2
    }


def _pictures(result: PreflightReport, metrics: Path | None, now: datetime) -> None:
    """The HTML page beside the JSON (the node x stage grid, the pairs as a heatmap) and,
    given ``metrics``, the Prometheus textfile (each node's stages, each pair's busbw, each
    stamp's age)."""
    report = result.as_report()
    bandwidth = result.details.get("bandwidth", {})
    fractions = pair_fractions(bandwidth)
    heat = (
        "<h2>Bandwidth: each pair as a fraction of the median</h2>"
        + html_report.heatmap(result.nodes, fractions)
        if fractions
        else ""
    )
    page = report_path(result.cluster).with_suffix(".html")
    write_atomic(page, html_report.page(report, f"Preflight for {result.cluster}", heat))
    print(f"    HTML report: {page}", file=sys.stderr)
    if metrics is None:
        return
    registry = prometheus.report_registry(report, "preflight", now.timestamp())
    prometheus.pair_bandwidth(
        registry,
        result.cluster,
        {
            (pair["nodes"][0], pair["nodes"][1]): pair["busbw_gbps"]
            for pair in bandwidth.get("pairs", {}).values()
            if pair.get("busbw_gbps") is not None and len(pair.get("nodes", ())) == 2
        },
    )
    ages = {}
    for node, stamp in stamps.load(result.cluster).items():
        when = stamps.passed_at(stamp)
        if when is not None:
            ages[node] = max(0.0, (now - when).total_seconds())
    prometheus.stamp_ages(registry, result.cluster, ages)
    prometheus.write(metrics, registry)
    print(f"    Prometheus metrics: {metrics}", file=sys.stderr)
