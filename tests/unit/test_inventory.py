"""Inventories load specs into pyinfra without contacting any host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def pyinfra(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYINFRA, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, **env},
    )


def hosts_pyinfra_sees(inventory: str, **env: str) -> list[dict]:
    """Each host of ``inventory`` as pyinfra loads it: name, groups and data. debug-inventory
    prints the inventory and exits before pyinfra connects to anything."""
    result = pyinfra("--json", inventory, "debug-inventory", **env)
    assert result.returncode == 0, result.stderr
    assert "Connecting" not in result.stdout + result.stderr
    return json.loads(result.stdout)


def test_prod_inventory_is_every_node_of_prod_yml_in_rank_order_with_strict_host_keys(tmp_path):
    home = tmp_path / "home"  # the spec's ~/.ssh paths, expanded where this test knows
    spec = str(REPO / "inventories/prod.yml")
    ssh = {
        "ssh_user": "root",
        "ssh_port": 22,
        "ssh_strict_host_key_checking": "yes",
        "trainfleet_spec": spec,
        "ssh_key": f"{home}/.ssh/id_ed25519",
        "ssh_known_hosts_file": f"{home}/.ssh/known_hosts",
    }
    assert hosts_pyinfra_sees("inventories/prod.py", HOME=str(home)) == [
        {
            "name": "gpu-a01",
            "groups": ["nodes", "prod"],
            "data": {
                **ssh,
                "ssh_hostname": "192.0.2.11",
                "trainfleet_node": "gpu-a01",
                "trainfleet_rank": 0,
                "trainfleet_gpus": 8,
            },
        },
        {
            "name": "gpu-a02",
            "groups": ["nodes", "prod"],
            "data": {
                **ssh,
                "ssh_hostname": "192.0.2.12",
                "trainfleet_node": "gpu-a02",
                "trainfleet_rank": 1,
                "trainfleet_gpus": 8,
            },
        },
    ]


LAB_SPEC = """\
cluster: {name: lab, domain: lab.trainfleet.test, mesh_users: [root]}
ssh: {user: ops, become: sudo, key: LAB/id_ed25519, known_hosts: LAB/known_hosts}
nodes:
  - {name: node1, address: 198.18.0.11, gpus: 0}
  - {name: node2, address: 198.18.0.12, gpus: 0, ssh: {user: root, become: null, port: 2222}}
"""


def test_the_lab_inventory_is_the_lab_specs_nodes_with_their_login_and_sudo(tmp_path):
    """The lab's inventory over a lab state dir this test writes (no lab is up): a sudo login on
    one node, root on another port on the other."""
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "spec.yml").write_text(LAB_SPEC.replace("LAB", str(lab)))
    common = {
        "ssh_strict_host_key_checking": "yes",
        "trainfleet_spec": str(lab / "spec.yml"),
        "trainfleet_gpus": 0,
        "ssh_key": f"{lab}/id_ed25519",
        "ssh_known_hosts_file": f"{lab}/known_hosts",
    }
    assert hosts_pyinfra_sees("inventories/lab.py", TRAINFLEET_LAB_DIR=str(lab)) == [
        {
            "name": "node1",
            "groups": ["nodes", "lab"],
            "data": {
                **common,
                "ssh_hostname": "198.18.0.11",
                "ssh_user": "ops",
                "ssh_port": 22,
                "trainfleet_node": "node1",
                "trainfleet_rank": 0,
                "_sudo": True,
                "_preserve_sudo_env": True,
            },
        },
        {
            "name": "node2",
            "groups": ["nodes", "lab"],
            "data": {
                **common,
                "ssh_hostname": "198.18.0.12",
                "ssh_user": "root",
                "ssh_port": 2222,
                "trainfleet_node": "node2",
                "trainfleet_rank": 1,
            },
        },
    ]


def test_the_lab_inventory_without_a_lab_stops_with_status_2(tmp_path):
    result = pyinfra(
        "--json", "inventories/lab.py", "debug-inventory", TRAINFLEET_LAB_DIR=str(tmp_path)
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.splitlines()[-1] == (
        "trainfleet: the lab is not up; start it with `python -m lab up 3`"
    )


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
    result = pyinfra(
        "-y",
        "inventories/prod.py",
        "deploy/drift.py",
        TRAINFLEET_DRIFT_STRIDE="1",
        TRAINFLEET_DRIFT_MESH="all",
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "trainfleet: TRAINFLEET_DRIFT_MESH is 'all': use full or sampled" in result.stderr
    assert (
        "trainfleet: TRAINFLEET_DRIFT_STRIDE is '1': a stride is 2..2 for 2 nodes" in result.stderr
    )
    assert "2 problem(s) in the environment; no host was contacted." in result.stderr
    assert "Connecting" not in result.stdout + result.stderr


def test_a_damaged_preflight_stamps_file_stops_pyinfra_with_status_2_before_connecting(tmp_path):
    """The stamps say which nodes the healthy launch files leave out: a file that is not one
    stops every run with its path (it never reads as "nobody left out"), nothing contacted."""
    stamps = tmp_path / "reports" / "preflight-prod-stamps.json"
    stamps.parent.mkdir()
    stamps.write_text('{"nodes": ["node1"]}')
    result = pyinfra(
        "-y", "inventories/prod.py", "deploy/cluster.py", TRAINFLEET_HOME=str(tmp_path)
    )
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"trainfleet: {stamps}: not a preflight stamps file" in result.stderr
    assert "1 problem(s) on the controller; no host was contacted." in result.stderr
    assert "Connecting" not in result.stdout + result.stderr
