"""The collective stage over the whole cluster, and isolation of a failing node or link."""

from __future__ import annotations

from typing import Any

from pyinfra.api import State, StringCommand

from checks.collective_verdicts import collective_problems, isolate, rank_failure, rank_layout
from checks.fabric_verdicts import nccl_socket_problems
from checks.nccl_decisions import nccl_decision_problems
from checks.preflight_report import PreflightReport
from checks.rank_output import node_steps
from checks.stage_runner import BOUNDS, python_stage, refusals, run_everywhere, stage_script
from trainfleet.defaults import VENV_DIR
from trainfleet.model import Cluster

COLLECTIVE = stage_script("collective.py")


_COLLECTIVE_RUN = stage_script("collective.sh")


# One process group a rank joins: (round, the node's first rank in it, its world, the master's
# address, its port). A rank runs its jobs one after the other in one process.
Job = tuple[int, int, int, str, int]


def collective_command(
    first: int,
    count: int,
    world: int,
    master: str,
    port: int,
    backend: str,
    seconds: int,
    nbytes: int = 0,
) -> StringCommand:
    """``count`` ranks on one node, global ranks ``first``.. of ``world``; with ``nbytes``, each
    also times an all_reduce of that size."""
    return jobs_command(count, backend, seconds, [(0, first, world, master, port)], nbytes)


def jobs_command(
    count: int, backend: str, seconds: int, jobs: list[Job], nbytes: int = 0
) -> StringCommand:
    """``count`` ranks on one node, each running ``jobs`` in turn in one process (torch imported
    once), a job of round r ending (r + 1) * ``seconds`` after the ranks started."""
    rounds = 1 + max(job[0] for job in jobs)
    return python_stage(
        _COLLECTIVE_RUN,
        f"{VENV_DIR}/bin/python",
        rounds * seconds + 5,
        COLLECTIVE,
        count,
        backend,
        seconds,
        nbytes,
        *(",".join(map(str, job)) for job in jobs),
        bound=rounds * seconds + 10,
    )


def backend_of(cluster: Cluster) -> str:
    return "nccl" if cluster.uses_gpus else "gloo"


def run_collective(
    state: State, cluster: Cluster, report: PreflightReport, networks: dict[str, Any]
) -> bool:
    """One rank per GPU (per CPU node) over the whole cluster; True when every rank finished
    with the right sum and the same versions. Then NCCL's own choice of network is judged."""
    backend = backend_of(cluster)
    seconds = BOUNDS["collective"]
    layout = rank_layout(cluster.nodes)
    out = run_everywhere(
        state,
        {
            n.name: collective_command(
                *layout[n.name],
                cluster.total_slots,
                cluster.master.address,
                cluster.master_port,
                backend,
                seconds,
            )
            for n in cluster.nodes
        },
        seconds,
    )
    steps = {
        node: node_steps(lines, layout[node][1]) for node, lines in out.items() if node in layout
    }
    report.details["collective"] = {
        "backend": backend,
        "world": cluster.total_slots,
        "steps": steps,
    }
    problems = refusals("collective", out) + collective_problems(cluster, steps)
    report.problems += problems
    if backend == "nccl" and not problems:
        logs = nccl_logs(steps)
        report.problems += nccl_socket_problems(cluster, logs, networks)
        seen, odd = nccl_decision_problems(cluster, logs, networks)
        report.details["collective"]["nccl"] = seen
        report.problems += odd
    return not problems


def nccl_logs(steps: dict[str, list[list[dict[str, Any]]]]) -> dict[str, list[list[str]]]:
    """Each node's finished ranks' NCCL INFO lines (a rank that failed proves nothing about
    them)."""
    return {
        node: [
            [s.get("text", "") for s in rank if s.get("step") == "nccl"]
            for rank in ranks
            if rank_failure(rank) is None
        ]
        for node, ranks in steps.items()
    }


def run_isolation(state: State, cluster: Cluster, report: PreflightReport) -> None:
    """2-rank collectives between the master and each node (one rank each), all at once on
    separate ports."""
    backend = backend_of(cluster)
    seconds = BOUNDS["isolation"]
    master = cluster.master
    others = [n for n in cluster.nodes if n.name != master.name]
    master_side = [
        collective_command(0, 1, 2, master.address, cluster.master_port + 1 + i, backend, seconds)
        for i, _ in enumerate(others)
    ]
    commands = {
        master.name: StringCommand(
            *[part for c in master_side for part in ("(", c, ")", ">/dev/null", "2>&1", "&")],
            "wait",
        )
    }
    for i, node in enumerate(others):
        commands[node.name] = collective_command(
            1, 1, 2, master.address, cluster.master_port + 1 + i, backend, seconds
        )
    out = run_everywhere(state, commands, seconds)
    pair_ok = {}
    for node in others:
        pair_ok[node.name] = rank_failure(node_steps(out.get(node.name, []), 1)[0]) is None
    report.details["isolation"] = pair_ok
    report.problems += isolate(cluster, pair_ok)
