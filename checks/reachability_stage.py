"""Stage 2, reachability: listeners on every node, every node probes every listener.

What a node prints is used in a later command only after a strict grammar accepted it
(listener PIDs), quoted; the listeners are ended by PID when the stage is done.
"""

from __future__ import annotations

import secrets

from pyinfra.api import State, StringCommand

from checks.preflight_report import PreflightReport, Problem
from checks.reachability_verdicts import listener_pids, reachability_problems
from checks.stage_runner import (
    BOUNDS,
    listener_workdir,
    python_stage,
    refusals,
    run_everywhere,
    shell_stage,
    stage_script,
)
from trainfleet.defaults import RUN_DIR
from trainfleet.model import Cluster

_LISTEN = stage_script("listen.sh")


_END_LISTENERS = stage_script("end_listeners.sh")


_PROBE = stage_script("probe.sh")


PROBE_PORT_OFFSET = -1  # peers' probe listeners sit at master_port - 1 (29499 by default)


def run_reachability(
    state: State, cluster: Cluster, report: PreflightReport, master_port_free: bool
) -> None:
    probe_port = cluster.master_port + PROBE_PORT_OFFSET
    seconds = BOUNDS["reachability"]
    listeners = {n.name: [(n.address, probe_port)] for n in cluster.nodes}
    if master_port_free:
        listeners[cluster.master.name].append((cluster.master.address, cluster.master_port))
    token = f"trainfleet-preflight-{secrets.token_hex(8)}"  # this run's listeners carry it
    started = run_everywhere(
        state,
        {
            node: shell_stage(
                listener_workdir(token, RUN_DIR) + _LISTEN,
                seconds,
                token,
                *[v for pair in pairs for v in pair],
            )
            for node, pairs in listeners.items()
        },
        seconds,
    )
    pids: dict[str, list[int]] = {}
    for node, lines in sorted(started.items()):
        pids[node], refused = listener_pids(lines)
        report.problems += [
            Problem(
                "reachability",
                node,
                f"printed {line[:80]!r} where a listener's PID belongs: "
                "not used (the listener ends by its timeout)",
            )
            for line in refused
        ]
    report.problems += refusals("reachability", started)
    try:
        targets = [f"{n.name}={n.address}:{probe_port}" for n in cluster.nodes]
        if master_port_free:
            targets.append(
                f"{cluster.master.name}:{cluster.master_port}={cluster.master.address}:{cluster.master_port}"
            )
        out = run_everywhere(
            state,
            {n.name: python_stage(_PROBE, n.address, *targets) for n in cluster.nodes},
            seconds,
        )
        report.problems += [p for p in refusals("reachability", out) if p not in report.problems]
        matrix: dict[str, dict[str, str]] = {}
        for node, lines in out.items():
            row = {t.split("=", 1)[0]: "no answer" for t in targets}
            for line in lines:
                status, _, rest = line.partition(" ")
                name, _, reason = rest.partition(" ")
                if name in row:
                    row[name] = "ok" if status == "ok" else reason
            matrix[node] = row
        report.details["reachability"] = matrix
        report.problems += reachability_problems(cluster, matrix)
    finally:  # end the listeners we started, by PID (timeout ends them anyway), and their directory
        run_everywhere(
            state, {node: end_listeners_command(token, pids.get(node, [])) for node in started}, 5
        )


def end_listeners_command(token: str, pids: list[int]) -> StringCommand:
    """Kill these PIDs (validated ints) if they are still this run's listeners; remove the
    listeners' working directory."""
    return shell_stage(
        _END_LISTENERS, f"{RUN_DIR}/{token}", token, *(str(int(pid)) for pid in pids)
    )
