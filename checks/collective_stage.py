"""The collective stage over the whole cluster, and isolation of a failing node or link."""

from __future__ import annotations

import secrets
from typing import Any

from pyinfra.api import State, StringCommand

from checks.bandwidth_verdicts import intruded_problems, unserved
from checks.collective_verdicts import (
    collective_problems,
    isolate,
    rank_failure,
    rank_layout,
    rendezvous_tampered,
    second_pass,
)
from checks.fabric_verdicts import nccl_socket_problems
from checks.nccl_decisions import nccl_decision_problems
from checks.pair_ports import pair_port
from checks.preflight_report import PreflightReport, Problem
from checks.rank_output import job_steps, node_steps
from checks.stage_runner import (
    BOUNDS,
    RUN_DIR,
    private_workdir,
    python_stage,
    refusals,
    run_everywhere,
    stage_script,
)
from trainfleet.model import VENV_PYTHON, Cluster

COLLECTIVE = stage_script("collective.py")


_COLLECTIVE_RUN = stage_script("collective.sh")


# One process group a rank joins: (its end, in seconds after the ranks start; the node's first
# rank in it; its world; the master's address; its port; the bytes of its timed all_reduce, 0
# for none). A rank runs its jobs one after the other in one process.
Job = tuple[int, int, int, str, int, int]


def collective_command(
    first: int,
    count: int,
    world: int,
    master: str,
    port: int,
    backend: str,
    seconds: int,
    python: str | None = None,
) -> StringCommand:
    """``count`` ranks on one node, global ranks ``first``.. of ``world``, done in ``seconds``."""
    return jobs_command(count, backend, [(seconds, first, world, master, port, 0)], python)


def jobs_command(
    count: int, backend: str, jobs: list[Job], python: str | None = None
) -> StringCommand:
    """``count`` ranks on one node, each running ``jobs`` in turn in one process (torch imported
    once), each job ending by its own end, by ``python`` (the cluster's ``job_python``)."""
    end = max(job[0] for job in jobs)
    return python_stage(
        _COLLECTIVE_RUN,
        python or VENV_PYTHON,  # None: trainfleet's venv
        end + 5,
        COLLECTIVE,
        count,
        backend,
        *(",".join(map(str, job)) for job in jobs),
        bound=end + 10,
    )


def rendezvous_secret() -> str:
    """A fresh secret for one command's rendezvous stores: only ranks that hold it are served
    (checks/preflight_stages/collective.py). It reaches them on stdin alone: never in a command
    line or an environment another user of the node can read, never printed or reported."""
    return secrets.token_hex(32)


def backend_of(cluster: Cluster) -> str:
    return "nccl" if cluster.uses_gpus else "gloo"


def run_collective(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    networks: dict[str, Any],
    then: dict[str, list[Job]] | None = None,
) -> tuple[bool, dict[str, list[list[list[dict[str, Any]]]]]]:
    """One rank per GPU (per CPU node) over the whole cluster; True when every rank finished
    with the right sum and the same versions. Then NCCL's own choice of network is judged.

    + then: each node's jobs after the collective, in the same command and the same processes
      (the bandwidth stage's pairs), run only where the collective passed
    Returns (passed, each node's ranks' steps per job: the collective's first, ``then``'s after).
    """
    backend = backend_of(cluster)
    seconds = BOUNDS["collective"]
    layout = rank_layout(cluster.nodes)
    jobs = {
        n.name: [
            (
                seconds,
                layout[n.name][0],
                cluster.total_slots,
                cluster.master.address,
                cluster.master_port,
                0,
            ),
            *(then or {}).get(n.name, []),
        ]
        for n in cluster.nodes
    }
    out = run_everywhere(
        state,
        {
            n.name: jobs_command(layout[n.name][1], backend, jobs[n.name], cluster.job_python)
            for n in cluster.nodes
        },
        max(job[0] for node_jobs in jobs.values() for job in node_jobs),
        stdin=rendezvous_secret(),
    )
    ranks = {
        node: [job_steps(rank, len(jobs[node])) for rank in node_steps(lines, layout[node][1])]
        for node, lines in out.items()
        if node in layout
    }
    steps = {node: [rank[0] for rank in node_ranks] for node, node_ranks in ranks.items()}
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
    return not problems, ranks


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
    """Two passes of 2-rank collectives (one rank each), every pair of a pass at once on a port
    of its own: the master with each node; then each suspect with a node known good (one that
    passed with the master), or, where every pair with the master failed, the first other node
    with each of the rest (is it the master, or not one node at all?). A pair whose host could
    not serve its rendezvous names the host alone and is judged no further; one that failed at
    a rendezvous whose store refused an intruder gives no verdict: every node is named alike."""
    with_master = [(cluster.master.name, n.name) for n in cluster.nodes[1:]]
    said, unserved_on, intruded_pairs = _judged_pairs(
        cluster, with_master, run_pairs(state, cluster, with_master)
    )
    first = {node: why is None for node, why in said.items()}
    pairs = second_pass(cluster, first) if not intruded_pairs and not unserved_on else []
    then: dict[str, str | None] = {}
    if pairs:
        then, more_unserved, more_intruded = _judged_pairs(
            cluster, pairs, run_pairs(state, cluster, pairs)
        )
        unserved_on += more_unserved
        intruded_pairs += more_intruded
    second = {b: (a, then[b] is None) for a, b in pairs if b in then}
    report.details["isolation"] = {
        "with the master": first,
        "second pass": {f"{a} {b}": then[b] is None for a, b in pairs if b in then},
    }
    report.problems += unserved_on
    if intruded_pairs:
        report.problems += intruded_problems(cluster, "isolation", intruded_pairs)
        return
    if unserved_on:
        return  # a host's own port decided those pairs: nothing tells the rest apart
    # each culprit's cause ends with its own rank's words, from its last failing pair (not
    # where every node is named alike: that verdict is the cluster's, not one rank's)
    found = isolate(cluster, first, second)
    words = {node: why for node, why in (said | then).items() if why}
    if len(found) < len(cluster.nodes):
        found = [
            Problem(p.stage, p.node, f"{p.cause} ({p.node}'s rank: {words[p.node]})")
            if p.node in words
            else p
            for p in found
        ]
    report.problems += found


def _judged_pairs(
    cluster: Cluster,
    pairs: list[tuple[str, str]],
    ranks: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
) -> tuple[dict[str, str | None], list[Problem], list[str]]:
    """From each pair's two ranks (``run_pairs``): ``{second node: why its rank failed, None
    where it passed}`` for the pairs that can be judged; a Problem naming the host alone for
    each pair whose host could not serve its rendezvous; the pairs whose rendezvous failed while
    their store refused an intruder (judged for nobody)."""
    said: dict[str, str | None] = {}
    unserved_on: list[Problem] = []
    intruded_pairs: list[str] = []
    for i, (a, b) in enumerate(pairs):
        host, joiner = ranks[b]
        if rendezvous_tampered([host, joiner]):
            intruded_pairs.append(f"the isolation pair {a}-{b}")
        elif why := unserved(host, pair_port(cluster, i)):
            unserved_on.append(Problem("isolation", a, why))
        else:
            said[b] = rank_failure(joiner)
    return said, unserved_on, intruded_pairs


def run_pairs(
    state: State, cluster: Cluster, pairs: list[tuple[str, str]]
) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Each pair's 2-rank collective, all at once (rank 0 on the pair's first node, where its
    rendezvous is; rank 1 on the second, each node second in one pair at most): ``{second
    node: (its pair's rank 0's steps, its own rank's steps)}``, in the pairs' order. A node
    first in several pairs runs them side by side, each one's output kept in a file of its own
    (in a private root-only directory) and printed after, behind the pair's place among them."""
    backend = backend_of(cluster)
    seconds = BOUNDS["isolation"]
    hosting: dict[str, list[StringCommand]] = {}
    joining: dict[str, StringCommand] = {}
    place: dict[str, tuple[str, int]] = {}  # second node -> (its host, the pair's place there)
    for i, (a, b) in enumerate(pairs):
        port = pair_port(cluster, i)
        address = cluster.node(a).address
        place[b] = (a, len(hosting.get(a, [])))
        hosting.setdefault(a, []).append(
            collective_command(0, 1, 2, address, port, backend, seconds, cluster.job_python)
        )
        joining[b] = collective_command(
            1, 1, 2, address, port, backend, seconds, cluster.job_python
        )
    # a node hosting several pairs reads the secret once and hands it to each on its stdin
    # (printf is the shell's own: no process shows it in its arguments)
    commands = {
        node: StringCommand(
            *("IFS=", "read", "-r", "secret;"),
            private_workdir(RUN_DIR),
            *[
                part
                for j, c in enumerate(sides)
                for part in ("(", "printf", "'%s\\n'", '"$secret"', "|", c, ")")
                + (f'>"$work/{j}"', "2>&1", "&")
            ],
            "wait;",
            *[part for j in range(len(sides)) for part in ("sed", f"'s/^/{j} /'", f'"$work/{j}";')],
            "true",
        )
        for node, sides in hosting.items()
    }
    if hosting.keys() & joining.keys():
        raise ValueError(
            f"a node both hosts and joins a pair: {sorted(hosting.keys() & joining.keys())}"
        )
    commands |= joining
    out = run_everywhere(state, commands, seconds, stdin=rendezvous_secret())
    return {
        b: (
            node_steps(hosted_lines(out.get(a, []), j), 1)[0],
            node_steps(out.get(b, []), 1)[0],
        )
        for b, (a, j) in place.items()
    }


def hosted_lines(lines: list[str], place: int) -> list[str]:
    """The output of a host's ``place``-th pair, from the lines run_pairs printed behind it."""
    tag = f"{place} "
    return [line[len(tag) :] for line in lines if line.startswith(tag)]
