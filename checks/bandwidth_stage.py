"""The bandwidth stage: a timed all_reduce per node pair, round by round."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pyinfra.api import State, StringCommand

from checks.bandwidth_verdicts import (
    bandwidth_failures,
    bandwidth_problems,
    pair_figures,
    pair_name,
    pair_rounds,
)
from checks.collective_stage import Job, backend_of, jobs_command
from checks.collective_verdicts import rank_layout
from checks.counters_verdicts import Counters, counter_problems, read_counters
from checks.preflight_report import PreflightReport
from checks.rank_output import job_steps, node_steps
from checks.stage_runner import BOUNDS, refusals, run_everywhere, shell_stage, stage_script
from trainfleet.hw.infiniband import ERROR_COUNTERS
from trainfleet.model import Cluster, Node

# The bandwidth stage's buffer: large enough that NCCL reaches its plateau on a fabric (nccl-tests'
# busbw flattens from a few hundred MiB), small enough that gloo on CPU nodes takes seconds.
BANDWIDTH_BYTES = MappingProxyType({"nccl": 256 << 20, "gloo": 16 << 20})


def node_pairs(rounds: list[list[tuple[str, ...]]]) -> dict[str, list[tuple[str, ...]]]:
    """Each node's pairs in the order its ranks run them (round by round): job i of a node's
    ranks is its i-th pair."""
    mine: dict[str, list[tuple[str, ...]]] = {}
    for pairs in rounds:
        for pair in pairs:
            for node in pair:
                mine.setdefault(node, []).append(pair)
    return mine


def bandwidth_commands(
    cluster: Cluster, rounds: list[list[tuple[str, ...]]], seconds: int
) -> dict[str, StringCommand]:
    """One command per node: its ranks run each of the node's pairs in turn, in one process (one
    torch import per rank for the whole stage). A pair (or a lone node, intra-node) is a job of
    every GPU of its nodes (one rank per CPU node), its rendezvous on its first node's cluster
    address, on a port of its own (master_port + 1 + its index among all pairs), so that no rank
    can join another pair's job; the pairs of a round run at once."""
    backend = backend_of(cluster)
    jobs: dict[str, list[Job]] = {}
    port = cluster.master_port
    for index, pairs in enumerate(rounds):
        for pair in pairs:
            port += 1
            nodes = [cluster.node(name) for name in pair]
            layout = rank_layout(nodes)
            world = sum(n.slots for n in nodes)
            for node in nodes:
                first = layout[node.name][0]
                jobs.setdefault(node.name, []).append((index, first, world, nodes[0].address, port))
    return {
        name: jobs_command(
            cluster.node(name).slots, backend, seconds, node_jobs, BANDWIDTH_BYTES[backend]
        )
        for name, node_jobs in jobs.items()
    }


def bandwidth_plan(cluster: Cluster) -> tuple[list[list[tuple[str, ...]]], str | None]:
    """The rounds of pairs to measure, or none and why: a single node measures its GPUs alone."""
    names = [n.name for n in cluster.nodes]
    if len(names) > 1:
        return pair_rounds(names), None
    if cluster.nodes[0].slots > 1:
        return [[(names[0],)]], None
    what = "one GPU" if cluster.uses_gpus else "one CPU rank (gloo)"
    return [], f"a single node with {what}: no link to measure"


def run_bandwidth(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    networks: dict[str, Any] | None = None,
) -> None:
    """Bus bandwidth of a timed all_reduce per node pair, round by round; with the spec's floor
    (``preflight.min_busbw_gbps``) the slow node or link is named, without one it is reported."""
    backend = backend_of(cluster)
    floor = cluster.preflight.get("min_busbw_gbps")
    rounds, skipped = bandwidth_plan(cluster)
    details: dict[str, Any] = {
        "backend": backend,
        "bytes": BANDWIDTH_BYTES[backend],
        "floor_gbps": floor,
        "pairs": {},
    }
    report.details["bandwidth"] = details
    if skipped:
        details["note"] = skipped
        report.stages["bandwidth"] = "skipped"
        return
    watched = [
        n
        for n in cluster.nodes
        if n.gpus > 0 or ((networks or {}).get(n.name) or {}).get("ib_ports")
    ]
    before = _counters(state, watched)
    measured: dict[tuple[str, ...], float] = {}
    seconds = BOUNDS["bandwidth"]
    out = run_everywhere(state, bandwidth_commands(cluster, rounds, seconds), seconds * len(rounds))
    report.problems += refusals("bandwidth", out)
    pairs_of = node_pairs(rounds)
    ranks = {
        node: [
            job_steps(rank, len(pairs))
            for rank in node_steps(out.get(node, []), cluster.node(node).slots)
        ]
        for node, pairs in pairs_of.items()
    }
    for pairs in rounds:
        for pair in pairs:
            steps = {
                node: [jobs[pairs_of[node].index(pair)] for jobs in ranks[node]] for node in pair
            }
            figures = pair_figures([rank for node in pair for rank in steps[node]])
            if figures is None:
                report.problems += bandwidth_failures(cluster, pair, steps)
                continue
            measured[pair] = figures["busbw_gbps"]
            details["pairs"][pair_name(pair)] = {"nodes": list(pair), **figures}
    report.problems += bandwidth_problems(measured, floor)
    report.problems += counter_problems(
        before, _counters(state, watched), [n.name for n in watched]
    )
    report.stages["bandwidth"] = (
        "failed" if any(p.stage == "bandwidth" for p in report.problems) else "ok"
    )


COUNTERS = stage_script("counters.sh")


def _counters(state: State, nodes: list[Node]) -> dict[str, Counters]:
    """The InfiniBand error counters and GPUs' PCIe replay counters of ``nodes`` (those with
    GPUs, or HCA ports the hygiene stage found), one command each."""
    if not nodes:
        return {}
    names = " ".join(ERROR_COUNTERS)
    commands = {
        n.name: shell_stage(COUNTERS, names, "", "gpu" if n.gpus else "", bound=30) for n in nodes
    }
    out = run_everywhere(state, commands, 30)
    return {node: read_counters(lines) for node, lines in out.items()}


def bandwidth_lines(details: dict[str, Any]) -> list[str]:
    """The measured figures for people, one line per pair (the floor, if any, after them)."""
    floor = details.get("floor_gbps")
    lines = [
        f"busbw {name}: {p['busbw_gbps']:.2f} GB/s "
        f"(algbw {p['algbw_gbps']:.2f} GB/s, {p['ranks']} ranks "
        f"{details.get('backend')}, {p['bytes'] >> 20} MiB)"
        for name, p in details.get("pairs", {}).items()
    ]
    if lines:
        lines.append(
            f"busbw floor: {floor:g} GB/s"
            if floor is not None
            else "busbw floor: none (preflight.min_busbw_gbps): measured and reported only"
        )
    elif details.get("note"):
        lines.append(f"bandwidth not measured: {details['note']}")
    return lines
