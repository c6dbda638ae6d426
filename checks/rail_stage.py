"""The bandwidth stage per rail: on nodes with several compute rails (checks.rail_verdicts), each
node pair of the stage's rounds again on every rail both nodes have, rail i of one node with
rail i of the other, one rank each (local rank i: GPU i), over that one interface
(GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) or HCA (NCCL_IB_HCA). One command per node after the
node pairs (NCCL reads its HCAs once per process: the ranks that used every rail cannot be made to
use one), the same rounds, bounds and rendezvous as the node pairs'."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, NamedTuple

from pyinfra.api import State

from checks.bandwidth_verdicts import (
    better,
    confirmed_rounds,
    intruded_problems,
    pair_figures,
    twice_text,
)
from checks.collective_stage import backend_of, jobs_command, rendezvous_secret
from checks.collective_verdicts import rendezvous_tampered
from checks.pair_ports import rail_ports
from checks.preflight_report import PreflightReport, Problem
from checks.rail_verdicts import (
    RailPair,
    judged_medians,
    node_rails,
    rail_failures,
    rail_label,
    rail_medians,
    rail_pair_name,
    rail_problems,
    rail_rounds,
    slow_rail_pairs,
)
from checks.rank_output import job_steps, node_steps
from checks.stage_runner import BOUNDS, run_everywhere
from trainfleet.model import Cluster

# A rail pair's buffer: one rail carries it, so NCCL keeps the node pairs' plateau size; gloo on
# a CPU node's extra NICs needs less to tell a rail at 1/8 of the others (seconds matter there).
RAIL_BYTES = MappingProxyType({"nccl": 256 << 20, "gloo": 4 << 20})


class RailJob(NamedTuple):
    """A rail job: a Job (checks.collective_stage) and the rail with the local rank that runs
    it; passed to the ranks field by field, in this order."""

    end: int  # seconds after the ranks start
    first: int  # the node's first rank in it: 0 on the pair's first node, 1 on the other
    world: int
    master: str  # the pair's first node's cluster address: the rendezvous
    port: int
    size: int  # the bytes of its timed all_reduce
    rail: str  # "if:eth2", "hca:mlx5_4"
    local_rank: int  # the rank that runs it: rail r's pairs run on local rank r


def rail_plan(
    cluster: Cluster, rounds: list[list[tuple[str, ...]]], envs: dict[str, dict[str, str]]
) -> tuple[dict[str, list[str]], list[list[RailPair]]]:
    """Each node's rails and the rounds of rail pairs (none where no two nodes share two rails).
    ``envs``: each node's environment as its ranks get it (the hygiene stage's reading)."""
    rails = node_rails(cluster, envs)
    return rails, rail_rounds(rounds, rails)


def rail_jobs(
    cluster: Cluster,
    rails: dict[str, list[str]],
    plan: list[list[RailPair]],
    ports: dict[RailPair, int],
    seconds: int,
) -> dict[str, list[RailJob]]:
    """Each node's rail jobs, in the order of ``plan``: a rail pair of round k ends (k + 1) x
    ``seconds`` after the ranks start (the first round also covers torch's import, as the
    re-test's does), its rendezvous on its first node's cluster address, on its own port."""
    backend = backend_of(cluster)
    jobs: dict[str, list[RailJob]] = {}
    for k, items in enumerate(plan):
        for pair, r in items:
            port = ports[(pair, r)]
            host = cluster.node(pair[0]).address
            for first, node in enumerate(pair):
                jobs.setdefault(node, []).append(
                    RailJob(
                        (k + 1) * seconds,
                        first,
                        2,
                        host,
                        port,
                        RAIL_BYTES[backend],
                        rails[node][r],
                        r,
                    )
                )
    return jobs


def run_rails(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    rounds: list[list[tuple[str, ...]]],
    fraction: float,
) -> None:
    """Measure and judge the rail pairs of the node pairs' ``rounds`` (``details["rails"]`` of
    the bandwidth stage's details: each rail pair's figure as a fraction of its rail's median);
    no rails, no command."""
    details = report.details["bandwidth"]
    envs = {n: h.get("env") or {} for n, h in report.details.get("hygiene", {}).items()}
    rails, plan = rail_plan(cluster, rounds, envs)
    if not plan:
        return
    ports = rail_ports(cluster, rounds)
    measured, found, intruded = measure_rails(state, cluster, rails, plan, ports)
    medians = rail_medians(measured)
    twice: dict[RailPair, list[float | None]] = {}
    if again := set(slow_rail_pairs(measured, fraction, medians)):  # slow once: not yet slow
        kept = confirmed_rounds(plan, again)
        second, _, _ = measure_rails(state, cluster, rails, kept, ports)
        for item in again:
            twice[item] = [measured[item], second.get(item)]
            measured[item] = better(measured[item], second.get(item))
        medians = judged_medians(medians, measured, again)
    details["rails"] = {
        "rails": {node: [rail_label(r) for r in mine] for node, mine in rails.items() if mine},
        "bytes": RAIL_BYTES[backend_of(cluster)],
        "medians_gbps": {str(r + 1): m for r, m in sorted(medians.items())},
        "pairs": {
            rail_pair_name(pair, r, rails): {
                "nodes": list(pair),
                "rail": r + 1,
                "rails": [rail_label(rails[node][r]) for node in pair],
                "busbw_gbps": bw,
                "of_median": round(bw / medians[r], 3) if medians.get(r) else None,
                **({"measured_gbps": twice[(pair, r)]} if (pair, r) in twice else {}),
            }
            for (pair, r), bw in measured.items()
        },
    }
    if intruded:
        found += intruded_problems(cluster, "bandwidth", intruded)
    names = [n.name for n in cluster.nodes]
    report.problems += found + rail_problems(measured, rails, fraction, names, medians)


def measure_rails(
    state: State,
    cluster: Cluster,
    rails: dict[str, list[str]],
    plan: list[list[RailPair]],
    ports: dict[RailPair, int],
) -> tuple[dict[RailPair, float], list[Problem], list[str]]:
    """The rail pairs of ``plan``, one command per node: each pair's figure, the problems of
    those that gave none, those intruded upon (``_judged``)."""
    seconds = BOUNDS["bandwidth"]
    jobs = rail_jobs(cluster, rails, plan, ports, seconds)
    backend = backend_of(cluster)
    ranks_on = {node: 1 + max(job.local_rank for job in mine) for node, mine in jobs.items()}
    out = run_everywhere(
        state,
        {
            node: jobs_command(ranks_on[node], backend, mine, cluster.job_python)
            for node, mine in jobs.items()
        },
        len(plan) * seconds,
        stdin=rendezvous_secret(),
    )
    ranks = {
        node: [job_steps(rank, len(jobs[node])) for rank in node_steps(lines, ranks_on[node])]
        for node, lines in out.items()
        if node in jobs
    }
    return _judged(rails, plan, ports, jobs, ranks)


def _judged(
    rails: dict[str, list[str]],
    plan: list[list[RailPair]],
    ports: dict[RailPair, int],
    jobs: dict[str, list[RailJob]],
    ranks: dict[str, list[list[list[dict[str, Any]]]]],
) -> tuple[dict[RailPair, float], list[Problem], list[str]]:
    """Each rail pair's figure from its two ranks (local rank r of each node, the job's place
    among the node's jobs); the problems of those that gave none; those intruded upon."""
    measured: dict[RailPair, float] = {}
    found: list[Problem] = []
    intruded: list[str] = []
    # each job's place among its node's jobs, by its port and local rank (a rail pair's own)
    places = {
        node: {(job.port, job.local_rank): i for i, job in enumerate(mine)}
        for node, mine in jobs.items()
    }
    for items in plan:
        for pair, r in items:
            port = ports[(pair, r)]
            steps = {}
            for node in pair:
                place = places[node][(port, r)]
                node_ranks = ranks.get(node) or []
                steps[node] = node_ranks[r][place] if r < len(node_ranks) else []
            figures = pair_figures([steps[node] for node in pair])
            if figures is None and rendezvous_tampered(list(steps.values())):
                intruded.append(rail_pair_name(pair, r, rails))
            elif figures is None:
                found += rail_failures(pair, r, rails, steps)
            else:
                measured[(pair, r)] = figures["busbw_gbps"]
    return measured, found, intruded


def rail_lines(details: dict[str, Any]) -> list[str]:
    """The rail pairs' figures for people: one line per rail pair with its fraction of its
    rail's median, then each rail's median."""
    rails = details.get("rails") or {}
    lines = [
        f"busbw {name}: {p['busbw_gbps']:.2f} GB/s"
        + ("" if p.get("of_median") is None else f" ({p['of_median']:.2f} of the rail's median)")
        + twice_text(p)
        for name, p in (rails.get("pairs") or {}).items()
    ]
    medians = rails.get("medians_gbps") or {}
    if medians:
        lines.append(
            "busbw rail medians: "
            + ", ".join(f"rail {r} {m:.2f} GB/s" for r, m in medians.items())
            + ": a rail pair under the fraction of its rail's median is slow, a rail under "
            "that of the best rail's is slow on every node"
        )
    return lines
