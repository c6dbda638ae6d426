"""The bundle's own cost on a node (issue #27): the one command the re-run (``DeployState``)
and drift (``NodeFingerprint``) send each node, run alone on node1 of a converged 3-node lab;
wall and CPU (user + system, its children included) per run, medians, and its stdout bytes.

As root, under the lab lock (one script: up, deploy, measure, down even on failure)::

    flock /tmp/trainfleet-lab.lock python -m bench.node_cost [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from typing import Any

from runtime.bundle import DeployState, NodeFingerprint
from tests.lab.harness import LAB_INVENTORY, LabController, deploy_twice
from trainfleet.model import Cluster
from trainfleet.plan import cluster_blocks
from trainfleet.spec import load_cluster

NODE = "node1"
# bash's ``time`` counts the command's children (the bundle is one sh and what it starts).
TIMED = (
    'TIMEFORMAT="%R %U %S"; for i in $(seq {runs}); do '
    "{{ time sh {script} >/dev/null 2>&1; }} 2>&1; done"
)


def commands(cluster: Cluster) -> dict[str, str]:
    """Each bundle's command text exactly as the deploy and drift send it to ``NODE``."""
    users, blocks = cluster.mesh_users, cluster_blocks(cluster)
    peers = [n.name for n in cluster.nodes if n.name != NODE]
    return {
        "DeployState (re-run)": DeployState().command(users=users, blocks=blocks).get_raw_value(),
        "NodeFingerprint (drift)": NodeFingerprint()
        .command(users=users, peers=peers, blocks=blocks)
        .get_raw_value(),
    }


def measure(lab: LabController, name: str, command: str, runs: int) -> dict[str, Any]:
    script = f"/tmp/trainfleet-bundle-{abs(hash(name))}.sh"
    lab.ssh(NODE, f"cat > {script}", input=command)
    size = int(lab.ssh(NODE, f"sh {script} 2>/dev/null | wc -c").strip())
    lab.ssh(NODE, f"sh {script} >/dev/null 2>&1")  # warm: page cache, as a re-run finds it
    out = lab.ssh(NODE, f"bash -c '{TIMED.format(runs=runs, script=script)}'", timeout=600)
    samples = [tuple(map(float, line.split())) for line in out.splitlines() if line.strip()]
    wall, cpu = [s[0] for s in samples], [s[1] + s[2] for s in samples]
    return {
        "command": name,
        "runs": len(samples),
        "wall_s_median": statistics.median(wall),
        "cpu_s_median": statistics.median(cpu),
        "wall_s": wall,
        "cpu_s": cpu,
        "stdout_bytes": size,
        "command_bytes": len(command.encode()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    os.environ["TRAINFLEET_HOME"] = tempfile.mkdtemp(prefix="trainfleet-node-cost-")
    lab = LabController()
    try:
        lab.fresh(3)
        deploy_twice(LAB_INVENTORY, "deploy/cluster.py")
        cluster = load_cluster(lab.lab.spec)
        results = [
            measure(lab, name, command, args.runs) for name, command in commands(cluster).items()
        ]
        cpu = lab.ssh(NODE, "grep -m1 'model name' /proc/cpuinfo; nproc").strip()
        print(
            json.dumps({"machine": cpu, "kernel": platform.release(), "results": results}, indent=2)
        )
    finally:
        lab.down()


if __name__ == "__main__":
    main()
