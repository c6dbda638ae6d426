"""What a preflight covers and how long it may take: its worst case for N nodes (every stage's
bound, as the controller waits for it), what each node is seen with for its stamp (plan,
hardware ledger, kernel), and under a staleness bound which nodes are tested again."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from checks.bandwidth_stage import bandwidth_plan
from checks.bandwidth_verdicts import RETEST_MIN_NODES
from checks.mesh_stage import mesh_bound
from checks.pair_ports import rail_bound
from checks.stage_runner import BOUNDS
from trainfleet import stamps
from trainfleet.compare import digest
from trainfleet.model import Cluster
from trainfleet.plan_types import ClusterPlan

WAIT = 10  # s the controller waits past a stage command's own bound (run_everywhere)
SUDO = 30  # s the sudo proof may take (runtime.gather.prove_sudo)
COUNTERS = 50  # s a read of the error counters may take (checks.bandwidth_stage)


def worst_case(cluster: Cluster, smoke: str | None = None) -> dict[str, int]:
    """Seconds each step may take at most on this cluster, in the order they run; their sum is
    the preflight's worst case. The collective and the bandwidth pairs share one command that
    ends with the last round of pairs; isolation (two passes) runs only where the collective
    failed, when no pair runs, so the longer of the two counts. From RETEST_MIN_NODES nodes the
    bandwidth stage may re-test suspects with partners known good: one more round. Where nodes
    may have several rails (a GPU node's HCAs, the spec's ``preflight.rails``), the same rounds
    of pairs rail by rail follow, in a command of their own. The pairs (and rail pairs) the
    first measurement finds slow are measured once more, in their rounds: at worst every
    round again."""
    nodes = len(cluster.nodes)
    rounds, _ = bandwidth_plan(cluster)
    retest = rounds and nodes >= RETEST_MIN_NODES  # a suspect re-tested: one more round
    collective = BOUNDS["collective"] + BOUNDS["bandwidth"] * len(rounds)
    collective += (BOUNDS["bandwidth"] + WAIT) if retest else 0
    steps = {
        "sudo proof": SUDO,
        "hygiene": BOUNDS["hygiene"] + WAIT,
        "clocks": 5 + WAIT,
        "reachability": 2 * (BOUNDS["reachability"] + WAIT) + 5 + WAIT,
    }
    if cluster.mesh_users:
        steps["ssh"] = mesh_bound(nodes, len(cluster.mesh_users)) + WAIT
    if rounds:
        steps["error counters"] = 2 * (COUNTERS + WAIT)
    steps["collective and bandwidth"] = max(
        collective + WAIT, BOUNDS["collective"] + WAIT + 2 * (BOUNDS["isolation"] + WAIT)
    )
    if rounds:  # the slow pairs measured again (checks.bandwidth_stage.measure_again)
        steps["slow pairs again"] = BOUNDS["bandwidth"] * len(rounds) + WAIT
    if rounds and len(cluster.nodes) > 1 and rail_bound(cluster):
        # the rail pairs (checks.rail_stage): the node pairs' rounds again, one command after,
        # and the slow ones once more
        steps["rails"] = 2 * (BOUNDS["bandwidth"] * len(rounds) + WAIT)
    if smoke:
        steps["smoke"] = BOUNDS["smoke"] + WAIT
    return steps


def bound_line(cluster: Cluster, steps: dict[str, int]) -> str:
    return (
        f"at most {sum(steps.values())} s for {len(cluster.nodes)} nodes ("
        + ", ".join(f"{name} {seconds}" for name, seconds in steps.items())
        + ")"
    )


def seen_now(
    cluster: Cluster,
    plan: ClusterPlan,
    hygiene: dict[str, dict[str, Any]],
    ledger: dict[str, dict[str, str]],
) -> dict[str, dict[str, Any]]:
    """Each node as its stamp records it: its plan (the spec's values for it and the NCCL
    environment derived from its network), its hardware ledger's parts (None before drift
    recorded any), its kernel's boot and GPU error line count (None: not read)."""
    seen = {}
    for node in cluster.nodes:
        mine = plan.nodes[node.name]
        spec = {k: v for k, v in asdict(node).items() if k != "rank"}
        values = {
            "node": spec,
            "stack": cluster.stack,
            "nccl": cluster.nccl,
            "gpu": cluster.gpu,
            "master_port": cluster.master_port,
            "env": mine.nccl_env.env,
        }
        parts = ledger.get(node.name)
        seen[node.name] = {
            "plan": digest(json.dumps(values, sort_keys=True, default=str)),
            "ledger": digest(json.dumps(parts, sort_keys=True)) if parts else None,
            "kernel": hygiene.get(node.name, {}).get("kernel"),
        }
    return seen


def scope(
    cluster: Cluster,
    recorded: dict[str, dict[str, Any]],
    seen: dict[str, dict[str, Any]],
    stale: timedelta,
    now: datetime,
    failed: set[str],
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Under a staleness bound: (the nodes to test, in rank order; why each is tested again;
    the nodes whose verdict carries over -> when they passed). A node the hygiene stage just
    failed (``failed``) is tested; so is, with the others, one node that carries over (the
    first in rank order), a partner known good for the collective."""
    names = [n.name for n in cluster.nodes]
    why = stamps.to_retest(recorded, seen, names, stale, now)
    for node in sorted(failed - why.keys()):
        why[node] = "failed the hygiene stage now"
    carried = [n for n in names if n not in why]
    test = set(why)
    if test and carried:
        partner = carried.pop(0)
        test.add(partner)
        why[partner] = "passed; tested again as a partner known good"
    return [n for n in names if n in test], why, {n: recorded[n]["at"] for n in carried}
