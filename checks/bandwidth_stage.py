"""The bandwidth stage: a timed all_reduce per node pair, round by round, run by the collective's
ranks after it (``run_collective``'s ``then``), and judged here."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from pyinfra.api import State

from checks.bandwidth_verdicts import (
    bandwidth_failures,
    bandwidth_problems,
    better_of_two,
    busbw_median,
    confirmed_rounds,
    intruded_problems,
    pair_figures,
    pair_name,
    retest_pairs,
    retested_problems,
    slow_pairs,
    twice_text,
)
from checks.collective_stage import Job, backend_of, jobs_command, rendezvous_secret
from checks.collective_verdicts import rank_layout, rendezvous_tampered
from checks.counters_verdicts import (
    Counters,
    counter_problems,
    read_counters,
    roce_figures,
    roce_lines,
)
from checks.pair_ports import bandwidth_rounds, pair_ports
from checks.preflight_report import PreflightReport
from checks.rail_stage import rail_lines, run_rails
from checks.rank_output import job_steps, node_steps
from checks.stage_runner import BOUNDS, run_everywhere, shell_stage, stage_script
from trainfleet.hw.infiniband import ERROR_COUNTERS, ROCE_COUNTERS
from trainfleet.model import Cluster, Node
from trainfleet.schema import BUSBW_FRACTION

# The bandwidth stage's buffer: large enough that NCCL reaches its plateau on a fabric (nccl-tests'
# busbw flattens from a few hundred MiB), small enough that gloo on CPU nodes takes seconds.
BANDWIDTH_BYTES = MappingProxyType({"nccl": 256 << 20, "gloo": 16 << 20})


def node_pairs(rounds: list[list[tuple[str, ...]]]) -> dict[str, list[tuple[str, ...]]]:
    """Each node's pairs in the order its ranks run them (round by round)."""
    mine: dict[str, list[tuple[str, ...]]] = {}
    for pairs in rounds:
        for pair in pairs:
            for node in pair:
                mine.setdefault(node, []).append(pair)
    return mine


def bandwidth_jobs(
    cluster: Cluster,
    rounds: list[list[tuple[str, ...]]],
    start: int,
    seconds: int,
    ports: dict[tuple[str, ...], int] | None = None,
) -> dict[str, list[Job]]:
    """Each node's jobs, run by its ranks after the collective in the same processes (one torch
    import per rank for both stages). A pair (or a lone node, intra-node) is a job of every GPU
    of its nodes (one rank per CPU node), its rendezvous on its first node's cluster address, on
    a port of its own (master_port + 1 + its index among all pairs), so that no rank can join
    another pair's job; a pair of round r ends ``start`` + (r + 1) x ``seconds`` after the ranks
    started, so a slow or hung pair costs its own round only; the pairs of a round run at
    once."""
    backend = backend_of(cluster)
    ports = ports or pair_ports(cluster, rounds)
    jobs: dict[str, list[Job]] = {}
    for index, pairs in enumerate(rounds):
        for pair in pairs:
            port = ports[pair]
            nodes = [cluster.node(name) for name in pair]
            layout = rank_layout(nodes)
            world = sum(n.slots for n in nodes)
            end = start + (index + 1) * seconds
            for node in nodes:
                jobs.setdefault(node.name, []).append(
                    (
                        end,
                        layout[node.name][0],
                        world,
                        nodes[0].address,
                        port,
                        BANDWIDTH_BYTES[backend],
                    )
                )
    return jobs


def bandwidth_plan(cluster: Cluster) -> tuple[list[list[tuple[str, ...]]], str | None]:
    """The rounds of pairs to measure, or none and why: a single node measures its GPUs alone."""
    if rounds := bandwidth_rounds(cluster):
        return rounds, None
    what = "one GPU" if cluster.uses_gpus else "one CPU rank (gloo)"
    return [], f"a single node with {what}: no link to measure"


def watched_nodes(cluster: Cluster, networks: dict[str, Any] | None) -> list[Node]:
    """The nodes whose error counters are read around the stage: those with GPUs, or HCA ports
    the hygiene stage found."""
    return [
        n
        for n in cluster.nodes
        if n.gpus > 0 or ((networks or {}).get(n.name) or {}).get("ib_ports")
    ]


def judge_bandwidth(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    ranks: dict[str, list[list[list[dict[str, Any]]]]],
    before: dict[str, Counters],
    watched: list[Node] | None = None,
) -> None:
    """Bus bandwidth of each pair's timed all_reduce (job 1.. of its nodes' ranks, ``ranks`` as
    ``run_collective`` returns them), against the cluster's median (under
    ``preflight.min_busbw_fraction`` of it a pair is slow) and the spec's floor
    (``preflight.min_busbw_gbps``), if any: the slow node or link is named by the pattern. The
    ``watched`` nodes' error counters (``before``: read before the command) are read again: one
    that grew under the load is named. On nodes with several rails, the same pairs rail by rail
    (checks.rail_stage), each rail judged alike: a slow rail is named on its node."""
    backend = backend_of(cluster)
    floor = cluster.preflight.get("min_busbw_gbps")
    fraction = cluster.preflight.get("min_busbw_fraction", BUSBW_FRACTION)
    rounds, skipped = bandwidth_plan(cluster)
    details: dict[str, Any] = {
        "backend": backend,
        "bytes": BANDWIDTH_BYTES[backend],
        "floor_gbps": floor,
        "min_fraction": fraction,
        "median_gbps": None,
        "pairs": {},
    }
    report.details["bandwidth"] = details
    if skipped:
        details["note"] = skipped
        report.stages["bandwidth"] = "skipped"
        return
    measured: dict[tuple[str, ...], float] = {}
    pairs_of = node_pairs(rounds)
    intruded_pairs: list[str] = []
    ports = pair_ports(cluster, rounds)  # as bandwidth_jobs gave them
    for pairs in rounds:
        for pair in pairs:
            port = ports[pair]
            steps = {
                node: [
                    jobs[1 + pairs_of[node].index(pair)] if len(jobs) > len(pairs_of[node]) else []
                    for jobs in ranks.get(node) or [[]] * cluster.node(node).slots
                ]
                for node in pair
            }
            figures = pair_figures([rank for node in pair for rank in steps[node]])
            if figures is None and rendezvous_tampered([r for node in pair for r in steps[node]]):
                intruded_pairs.append(pair_name(pair))  # named for nobody, failed for all
                continue
            if figures is None:
                report.problems += bandwidth_failures(cluster, pair, steps, port)
                continue
            measured[pair] = figures["busbw_gbps"]
            details["pairs"][pair_name(pair)] = {"nodes": list(pair), **figures}
    if intruded_pairs:
        report.problems += intruded_problems(cluster, "bandwidth", intruded_pairs)
    details["median_gbps"] = median = busbw_median(measured)
    if slow := slow_pairs(measured, floor, fraction, median):  # slow once is not yet slow
        measure_again(state, cluster, confirmed_rounds(rounds, slow), ports, measured, details)
    for pair in details["pairs"].values():  # every pair as a fraction of the median
        pair["of_median"] = round(pair["busbw_gbps"] / median, 3) if median else None
    names = [n.name for n in cluster.nodes]
    found = bandwidth_problems(measured, floor, fraction, names, median)
    if median and (again := retest_pairs(measured, floor, fraction, names, median)):
        retested = run_retest(state, cluster, again)
        details["retest"] = {f"{a} {b}": retested[b][1] for a, b in again}
        found = retested_problems(found, retested, median, floor, fraction)
    report.problems += found
    run_rails(state, cluster, report, rounds, fraction)  # the same pairs, rail by rail
    watched = watched or []
    after = read_error_counters(state, watched)
    report.problems += counter_problems(before, after, [n.name for n in watched])
    details["roce"] = roce_figures(before, after)  # RoCE retransmits, pauses, CNPs (#40)
    report.stages["bandwidth"] = (
        "failed" if any(p.stage == "bandwidth" for p in report.problems) else "ok"
    )


def measure_again(
    state: State,
    cluster: Cluster,
    rounds: list[list[tuple[str, ...]]],
    ports: dict[tuple[str, ...], int],
    measured: dict[tuple[str, ...], float],
    details: dict[str, Any],
) -> None:
    """The slow pairs' timed all_reduce once more (``rounds``: the stage's rounds with those
    pairs only), in a command of their own: each is judged by the better of its two figures
    (``better_of_two``), against the first measurement's median. A busy host's few slow
    seconds (another job, a controller under load) name no node; a slow node or link is slow
    both times. A pair the second run gave no figure for keeps its first."""
    for pair, second in run_pairs(state, cluster, rounds, ports).items():
        name = pair_name(pair)
        details["pairs"][name] = better_of_two(details["pairs"][name], second)
        measured[pair] = details["pairs"][name]["busbw_gbps"]


def run_pairs(
    state: State,
    cluster: Cluster,
    rounds: list[list[tuple[str, ...]]],
    ports: dict[tuple[str, ...], int],
) -> dict[tuple[str, ...], dict[str, Any] | None]:
    """Each pair's timed all_reduce, round by round as ``bandwidth_jobs`` lays them out (each
    round its bound; the first also covers torch's import), each on its own port (``ports``,
    ``pair_ports``): ``{pair: its figures, None where none}``."""
    backend = backend_of(cluster)
    seconds = BOUNDS["bandwidth"]
    jobs = bandwidth_jobs(cluster, rounds, 0, seconds, ports)
    out = run_everywhere(
        state,
        {
            node: jobs_command(cluster.node(node).slots, backend, mine, cluster.job_python)
            for node, mine in jobs.items()
        },
        len(rounds) * seconds,
        stdin=rendezvous_secret(),
    )
    pairs_of = node_pairs(rounds)
    return {
        pair: pair_figures(
            [
                job_steps(rank, len(jobs[node]))[pairs_of[node].index(pair)]
                for node in pair
                for rank in node_steps(out.get(node, []), cluster.node(node).slots)
            ]
        )
        for pairs in rounds
        for pair in pairs
    }


def run_retest(
    state: State, cluster: Cluster, pairs: list[tuple[str, str]]
) -> dict[str, tuple[str, float | None]]:
    """Each (partner known good, suspect) pair's timed all_reduce, all at once in one round of
    the stage's bound (``run_pairs``; the partner hosts the pair's rendezvous on an isolation
    pair's port, which hygiene checked): ``{suspect: (partner, busbw, None where no figure)}``."""
    figures = run_pairs(state, cluster, [list(pairs)], pair_ports(cluster, [list(pairs)]))
    return {
        suspect: (good, found["busbw_gbps"] if (found := figures[(good, suspect)]) else None)
        for good, suspect in pairs
    }


COUNTERS = stage_script("counters.sh")


def read_error_counters(state: State, nodes: list[Node]) -> dict[str, Counters]:
    """The InfiniBand error counters, GPUs' PCIe replay counters and NVLinks' error counters of
    ``nodes`` (``watched_nodes``), one command each."""
    if not nodes:
        return {}
    names, roce = " ".join(ERROR_COUNTERS), " ".join(ROCE_COUNTERS)
    commands = {
        n.name: shell_stage(COUNTERS, names, "", "gpu" if n.gpus else "", roce, bound=50)
        for n in nodes
    }  # (its two nvidia-smi calls: 25 s and 15 s at most; ethtool -S at once: 6 s)
    out = run_everywhere(state, commands, 50)
    return {node: read_counters(lines) for node, lines in out.items()}


def bandwidth_lines(details: dict[str, Any]) -> list[str]:
    """The measured figures for people, one line per pair with its fraction of the median; the
    median and what a slow pair is, and the floor if any, after them."""
    floor = details.get("floor_gbps")
    median = details.get("median_gbps")
    lines = [
        f"busbw {name}: {p['busbw_gbps']:.2f} GB/s"
        + (f" ({p['of_median']:.2f} of the median)" if p.get("of_median") is not None else "")
        + f" (algbw {p['algbw_gbps']:.2f} GB/s, {p['ranks']} ranks "
        f"{details.get('backend')}, {p['bytes'] >> 20} MiB)" + twice_text(p)
        for name, p in details.get("pairs", {}).items()
    ]
    if lines and median is not None:
        lines.append(
            f"busbw median: {median:.2f} GB/s (each node's best pair): a pair under "
            f"{details.get('min_fraction', BUSBW_FRACTION):g} of it is slow "
            "(preflight.min_busbw_fraction)"
        )
    if lines:
        lines.append(
            f"busbw floor: {floor:g} GB/s"
            if floor is not None
            else "busbw floor: none (preflight.min_busbw_gbps): judged against the median only"
        )
    elif details.get("note"):
        lines.append(f"bandwidth not measured: {details['note']}")
    return lines + rail_lines(details) + roce_lines(details.get("roce") or {})
