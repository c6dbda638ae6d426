"""Stage 1, hygiene: the master port, names, GPUs, environment, clocks, fabric ports."""

from __future__ import annotations

from typing import Any

from pyinfra.api import State

from checks.fabric_verdicts import ib_port_problems, mtu_problems
from checks.hygiene_output import parse_hygiene
from checks.hygiene_verdicts import (
    clock_problems,
    hygiene_problems,
    pair_port_problems,
    port_listing_problems,
    shm_warnings,
)
from checks.pair_ports import hosted_ports
from checks.preflight_report import PreflightReport, Problem
from checks.stage_runner import BOUNDS, run_everywhere, shell_stage, stage_script
from facts.nccl_env_facts import NcclNetwork
from runtime.gather import gather_fact
from trainfleet.defaults import LAUNCH_DIR
from trainfleet.hw.kernel_log import GREP
from trainfleet.model import Cluster
from trainfleet.nccl import ENV_PREFIXES
from trainfleet.plan import plan_cluster
from trainfleet.plan_types import ClusterPlan, Gathered

_HYGIENE = stage_script("hygiene.sh")


def preflight_plan(
    state: State, cluster: Cluster, networks: dict[str, Any] | None = None
) -> ClusterPlan:
    """The plan's names and NCCL environments, from one NcclNetwork read per node (no key store:
    the preflight plans no SSH mesh, and reading the store would create keys)."""
    return plan_cluster(
        cluster,
        Gathered(networks=gather_fact(state, NcclNetwork) if networks is None else networks),
    )


def run_hygiene(
    state: State, cluster: Cluster, report: PreflightReport
) -> tuple[dict[str, Any], ClusterPlan]:
    """Stage 1; returns each node's NcclNetwork fact (the collective judges NCCL's choice by it)
    and the plan it judged with (the stamps digest each node's part)."""
    names = [name for n in cluster.nodes for name in n.names]
    hosted = hosted_ports(cluster)
    out = run_everywhere(
        state,
        {
            n.name: shell_stage(
                _HYGIENE,
                cluster.master_port,
                int(n.rank == 0),
                n.name,
                f"{LAUNCH_DIR}/hostfile",
                GREP,
                " ".join(map(str, hosted[n.name])),
                n.address,
                " ".join(ENV_PREFIXES),  # the environment variables it prints
                *names,
                bound=BOUNDS["hygiene"],
            )
            for n in cluster.nodes
        },
        BOUNDS["hygiene"],
    )
    seen = {node: parse_hygiene(lines) for node, lines in out.items() if lines}
    # Clocks: a command of its own, so the window the controller brackets each read with is one
    # round trip (tens of ms), not the whole stage.
    windows: dict[str, tuple[float, float]] = {}
    read = run_everywhere(
        state,
        {node: shell_stage('echo "clock $(date +%s.%N)"', bound=5) for node in seen},
        5,
        windows,
    )
    clocks = {
        node: (clock, *windows[node])
        for node, lines in read.items()
        if node in windows and (clock := parse_hygiene(lines).get("clock")) is not None
    }
    report.problems += clock_problems(
        clocks, cluster.gpu["max_clock_offset_ms"], expected=set(seen)
    )
    for node in set(out) - set(seen):
        report.problems.append(Problem("hygiene", node, f"no answer within {BOUNDS['hygiene']} s"))
    slots = {node: data.pop("slots") for node, data in seen.items() if "slots" in data}
    networks = gather_fact(state, NcclNetwork)
    plan = preflight_plan(state, cluster, networks)
    expected = {name: p.nccl_env.env for name, p in plan.nodes.items() if not p.nccl_env.problems}
    report.details["hygiene"] = seen
    report.problems += hygiene_problems(cluster, seen, expected, slots)
    report.problems += port_listing_problems(cluster, seen, hosted)
    report.problems += pair_port_problems(seen, hosted)
    report.problems += ib_port_problems(cluster, networks)
    interfaces = {name: p.nccl_env.interface for name, p in plan.nodes.items()}
    report.problems += mtu_problems(cluster, networks, interfaces)
    report.warnings += shm_warnings(seen, "pyinfra -y <inventory> deploy/shm_cleanup.py")
    return networks, plan
