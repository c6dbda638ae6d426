"""The lab at its largest (32 nodes on this one machine): deploy, a re-run that changes
nothing, drift with two SSH logins per node, and one node down named by every check."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from bench.tally import exec_count
from checks.drift_check import report_path
from lab.netns import MAX_NODES
from tests.lab.harness import LAB_INVENTORY, REPO, deploy_twice, pyinfra
from trainfleet.mesh import probe_targets

NODES = [f"node{i}" for i in range(1, MAX_NODES + 1)]
DOWN = "node17"
ACCEPTED = re.compile(r"Accepted publickey for root from (198\.18\.0\.\d+) ")


@pytest.fixture(scope="module")
def converged(lab):
    lab.fresh(MAX_NODES)
    deploy_twice(LAB_INVENTORY, "deploy/cluster.py")
    return lab


def peer_logins(lab) -> dict[str, Counter]:
    """Per node, the SSH logins it accepted so far from each cluster address (sshd's log)."""
    logins = {}
    for node in lab.lab.nodes():
        text = (node.dir / "node.log").read_text(errors="replace")
        logins[node.name] = Counter(
            a for a in ACCEPTED.findall(text) if a != "198.18.0.1"
        )  # not the controller's
    return logins


def test_drift_at_32_nodes_is_one_command_per_node_and_two_mesh_logins_per_node(
    converged, tmp_path
):
    before = peer_logins(converged)
    tally_file = tmp_path / "tally.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.lab_driver",
            str(tally_file),
            "--",
            "-y",
            "--json",
            LAB_INVENTORY,
            "deploy/drift.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(report_path("lab").read_text())
    assert report["drift"] is False and report["findings"] == []
    assert exec_count(json.loads(tally_file.read_text()), NODES).per_node == {n: 1 for n in NODES}

    after = peer_logins(converged)
    address = {n.name: n.address for n in converged.lab.nodes()}
    stride = report["mesh_probe"]["stride"]
    want = {
        n: Counter(address[s] for s in NODES if n in probe_targets(NODES, s, stride)) for n in NODES
    }
    got = {n: after[n] - before[n] for n in NODES}
    # As target: exactly its two probers. Each logs in once, and at most once more: the probe
    # tries a peer again, alone, when its first try timed out or the connection dropped (on 2
    # cores, 32 nodes answering drift at once). A constant either way, whatever N.
    assert {n: set(logins) for n, logins in got.items()} == {
        n: set(logins) for n, logins in want.items()
    }
    assert {count for logins in got.values() for count in logins.values()} <= {1, 2}, got
    as_source = Counter(a for n in NODES for a in got[n].elements())
    assert len(as_source) == MAX_NODES and set(as_source.values()) <= {
        2,
        3,
        4,
    }  # as source: two peers each


def test_a_node_down_at_32_nodes_is_named_and_nothing_else_changes(converged):
    lab = converged.lab
    lab.stop(DOWN)
    try:
        drift = pyinfra(LAB_INVENTORY, "deploy/drift.py", timeout=600)
        report = json.loads(report_path("lab").read_text())
        assert drift.returncode != 0
        probers = {
            n for n in NODES if DOWN in probe_targets(NODES, n, report["mesh_probe"]["stride"])
        }
        named = {(f["node"], f["property"]) for f in report["findings"]}
        assert named == {(DOWN, "reachable")} | {(n, "ssh mesh (root)") for n in probers}

        deploy = pyinfra(LAB_INVENTORY, "deploy/cluster.py", timeout=600)
        assert deploy.returncode != 0 and f"[{DOWN}] Could not connect" in deploy.stderr
        assert deploy.changed() == {} and deploy.errors() == {}, (
            deploy.describe()
        )  # the others: converged, untouched
    finally:
        lab.start(DOWN)
    again = pyinfra(LAB_INVENTORY, "deploy/cluster.py", timeout=600)
    assert again.returncode == 0 and again.changed() == {}, again.describe()
    drift = pyinfra(LAB_INVENTORY, "deploy/drift.py", timeout=600)
    assert drift.returncode == 0, drift.describe()
