"""Inventories load specs into pyinfra without contacting any host."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def pyinfra(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYINFRA, *args], capture_output=True, text=True, cwd=REPO, timeout=60)


def test_prod_inventory_has_every_node_with_strict_host_keys():
    # debug-inventory prints the inventory and exits before pyinfra connects to anything.
    result = pyinfra("--json", "inventories/prod.py", "debug-inventory")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    hosts = data["hosts"] if "hosts" in data else data
    text = json.dumps(hosts)
    assert "gpu-a01" in text and "gpu-a02" in text
    assert "192.0.2.11" in text
    assert '"ssh_strict_host_key_checking": "yes"' in text
    assert "Connecting" not in result.stderr


def test_a_bad_spec_stops_pyinfra_with_status_2_before_connecting(tmp_path):
    spec = tmp_path / "bad.yml"
    spec.write_text(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: a, address: 192.0.2.1}\n"
    )
    inventory = tmp_path / "bad.py"
    inventory.write_text(
        "from runtime.inventory import load_cluster_or_exit, pyinfra_hosts\n"
        f"nodes = pyinfra_hosts(load_cluster_or_exit({str(spec)!r}))\n"
    )
    result = pyinfra("-y", str(inventory), "deploy/cluster.py")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"{spec}:3: nodes[1].name: duplicate name 'a'" in result.stderr
    assert f"{spec}:3: nodes[1].address: duplicate address" in result.stderr
    assert "Connecting" not in result.stdout + result.stderr


def test_a_bad_drift_probe_setting_stops_pyinfra_with_status_2_before_connecting():
    env = {
        **__import__("os").environ,
        "TRAINFLEET_DRIFT_STRIDE": "1",
        "TRAINFLEET_DRIFT_MESH": "all",
    }
    result = subprocess.run(
        [PYINFRA, "-y", "inventories/prod.py", "deploy/drift.py"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "trainfleet: TRAINFLEET_DRIFT_MESH is 'all': use full or sampled" in result.stderr
    assert (
        "trainfleet: TRAINFLEET_DRIFT_STRIDE is '1': a stride is 2..2 for 2 nodes" in result.stderr
    )
    assert "2 problem(s) in the environment; no host was contacted." in result.stderr
    assert "Connecting" not in result.stdout + result.stderr
