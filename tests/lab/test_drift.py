"""Drift runs on a converged 3-node lab: read-only, and each injected drift is named by node
and property, then cleared by re-running deploy/cluster.py."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.tally import exec_count
from checks.drift_check import report_path
from tests.lab.harness import LAB_INVENTORY, PYINFRA, REPO, deploy_twice, pyinfra

CLUSTER = "deploy/cluster.py"
DRIFT = "deploy/drift.py"
NODES = ["node1", "node2", "node3"]
# Everything trainfleet manages, checksummed to prove a drift run changes nothing.
MANAGED = (
    "sha256sum /etc/hosts /etc/hostname /etc/ssh/ssh_known_hosts /root/.ssh/* /etc/environment "
    "/etc/nccl.conf /etc/profile.d/trainfleet-nccl.sh /etc/genders /etc/trainfleet/launch/* "
    "/etc/trainfleet/launch/.deepspeed_env; hostname"
)


@pytest.fixture(scope="module")
def converged(lab):
    lab.fresh(3)
    deploy_twice(LAB_INVENTORY, CLUSTER)
    return SimpleNamespace(lab=lab)


def drift_run(data: dict[str, str] | None = None, **env):
    run = pyinfra(LAB_INVENTORY, DRIFT, env=env or None, data=data)
    report = json.loads(report_path("lab").read_text())
    return run, report


def findings(report) -> set[tuple[str, str]]:
    return {(f["node"], f["property"]) for f in report["findings"]}


def test_a_drift_run_on_a_converged_cluster_passes_and_changes_nothing(converged):
    before = {n: converged.lab.ssh(n, MANAGED) for n in NODES}

    run, report = drift_run()

    assert run.returncode == 0, run.describe()
    assert report["drift"] is False and report["findings"] == []
    assert run.changed() == {} and run.errors() == {}
    assert "no drift: 3 nodes match the spec and each other" in run.stderr
    assert (
        report["mesh_probe"]["mode"] == "sampled" and report["mesh_probe"]["logins_per_node"] == 2
    )
    assert {n: converged.lab.ssh(n, MANAGED) for n in NODES} == before
    dry = pyinfra(LAB_INVENTORY, CLUSTER, dry=True)
    assert dry.returncode == 0 and dry.report["plan"] and dry.planned_changes() == {}


def test_the_full_mesh_probe_runs_on_request_and_the_sampled_one_rotates(converged):
    run, report = drift_run(TRAINFLEET_DRIFT_MESH="full")
    assert run.returncode == 0, run.describe()
    assert report["mesh_probe"] == {
        "mode": "full",
        "stride": 0,
        "rotation": None,
        "logins_per_node": 3,
    }
    rotations = [drift_run()[1]["mesh_probe"]["rotation"] for _ in range(2)]
    assert rotations == [0, 1]


def test_a_hardware_capture_changes_nothing_and_diagnose_judges_it(converged):
    before = {n: converged.lab.ssh(n, MANAGED) for n in NODES}
    run = pyinfra(LAB_INVENTORY, "deploy/capture.py")
    assert run.returncode == 0, run.describe()
    assert run.changed() == {} and run.errors() == {}
    (line,) = [x for x in run.stderr.splitlines() if "--> Hardware capture of lab: " in x]
    capture = Path(line.split(": ", 1)[1])
    try:
        assert sorted(p.name for p in capture.iterdir()) == NODES
        assert stat.S_IMODE(capture.stat().st_mode) == 0o700
        for node in NODES:
            sources = dict(
                line.split(" ", 1)
                for line in (capture / node / "sources.txt").read_text().splitlines()
            )
            # a lab node: no GPU tools, its kernel log and command line whole
            assert sources["nvidia-smi-q.xml"] == "absent"
            assert sources["cmdline"] == sources["cpuinfo"] == "ok"
            assert (capture / node / "cpuinfo").read_text().startswith("processor")
        judged = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainfleet",
                "diagnose",
                str(capture),
                "--spec",
                str(converged.lab.lab.spec),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert judged.returncode == 0, judged.stdout + judged.stderr
        assert "no drift: 3 nodes match the spec and each other" in judged.stdout
    finally:
        shutil.rmtree(capture)
    assert {n: converged.lab.ssh(n, MANAGED) for n in NODES} == before


@pytest.mark.parametrize("deploy", [CLUSTER, DRIFT])
def test_a_converged_rerun_and_a_drift_run_each_cost_one_remote_command_per_node(
    converged, deploy, tmp_path
):
    # Counted where paramiko sends each SSH exec request (bench/lab_driver.py): every fact the
    # deploy reads, and every node's fingerprint, come in ONE command per node per run.
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
            deploy,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tally = json.loads(tally_file.read_text())
    assert exec_count(tally, NODES).per_node == {node: 1 for node in NODES}, tally["commands"]


def assert_detected_then_cleared(lab, expected: set[tuple[str, str]]):
    run, report = drift_run()
    assert run.returncode != 0, run.describe()
    assert expected <= findings(report), report["findings"]
    named = {node for node, _ in findings(report)} - {
        n for n in NODES if not report["nodes"][n]["reachable"]
    }
    if run.parsed is None and named == set(NODES):
        # Every node failed its check, so pyinfra prints no --json report ("No hosts remaining"):
        # read-only all the same, each node's one step ran no command.
        assert "No hosts remaining" in run.stderr, run.describe()
        assert all(f"[{n}] Error: executed 0 commands" in run.stderr for n in NODES), run.describe()
    else:
        assert run.changed() == {}  # read-only, even when it finds drift
        assert {n for hosts in run.errors().values() for n in hosts} == named
    deploy_twice(LAB_INVENTORY, CLUSTER)
    run, report = drift_run()
    assert run.returncode == 0 and not report["drift"], report["findings"]


def test_a_hand_edited_hosts_block_and_launcher_file_are_named_with_what_changed(converged):
    launcher = "/etc/trainfleet/launch/torchrun.sh"
    converged.lab.ssh("node2", "sed -i 's/^198.18.0.13 /198.18.0.99 /' /etc/hosts")
    converged.lab.ssh("node2", f"sed -i 's/--nnodes=/--max-restarts=9 --nnodes=/' {launcher}")
    run, report = drift_run()
    found = {f["property"]: f for f in report["findings"] if f["node"] == "node2"}
    assert found["launcher files"]["files"] == [launcher] and found["hosts block"]["files"] == [
        "/etc/hosts"
    ]
    (added,) = [
        line
        for line in found["launcher files"]["diff"]
        if line.startswith("+") and "--nnodes=" in line
    ]
    assert "--max-restarts=9 --nnodes=" in added
    assert any(line.startswith("-198.18.0.13 ") for line in found["hosts block"]["diff"])
    assert any(line.startswith("+198.18.0.99 ") for line in found["hosts block"]["diff"])
    assert (
        f"node2: launcher files: {launcher}" in run.stderr
        and f"    {added}" in run.stderr.splitlines()
    )
    assert "node2: hosts block: /etc/hosts" in run.stderr
    assert_detected_then_cleared(
        converged.lab, {("node2", "hosts block"), ("node2", "launcher files")}
    )


def test_a_removed_nccl_variable_is_named_and_scraped_as_a_metric(converged, tmp_path):
    converged.lab.ssh("node3", "sed -i '/^NCCL_IB_DISABLE=/d' /etc/environment")
    metrics = tmp_path / "trainfleet.prom"
    run, report = drift_run(data={"trainfleet_metrics": str(metrics)})
    (finding,) = [f for f in report["findings"] if f["property"] == "NCCL env (non-login ssh)"]
    assert finding["node"] == "node3" and "NCCL_IB_DISABLE=1" in finding["expected"]
    assert "NCCL_IB_DISABLE" not in finding["observed"]
    # the same finding, as node_exporter's textfile collector would serve it to Prometheus
    ok = {
        (s.labels["node"], s.labels["check"]): s.value
        for family in text_string_to_metric_families(metrics.read_text())
        for s in family.samples
        if s.name == "trainfleet_node_ok"
    }
    assert ok[("node3", "NCCL env (non-login ssh)")] == 0
    assert ok[("node1", "NCCL env (non-login ssh)")] == 1 and ok[("node3", "reachable")] == 1
    page = report_path("lab").with_suffix(".html").read_text()  # the page beside the JSON
    assert "3 nodes, 1 odd: node3" in page and "NCCL env (non-login ssh)" in page
    assert_detected_then_cleared(
        converged.lab, {("node3", "NCCL env (non-login ssh)"), ("node3", "NCCL env files")}
    )


def test_a_duplicate_hostname_is_named_on_both_nodes(converged):
    converged.lab.ssh("node3", "hostname node1 && echo node1 > /etc/hostname")
    assert_detected_then_cleared(
        converged.lab,
        {("node1", "hostname"), ("node3", "hostname"), ("node3", "hostname (persistent)")},
    )


def test_a_copied_machine_id_is_named_on_both_nodes(converged):
    lab = converged.lab
    original = lab.host("node2").file("/etc/machine-id").content_string
    lab.ssh(
        "node2",
        "cat > /etc/machine-id",
        input=lab.host("node1").file("/etc/machine-id").content_string,
    )
    run, report = drift_run()
    assert run.returncode != 0
    assert {("node1", "machine-id"), ("node2", "machine-id")} <= findings(report)
    # machine-ids are not the deploy's to rewrite (journald and D-Bus key on them): the fix
    # is the operator's, as on a cloned image (systemd-machine-id-setup).
    lab.ssh("node2", "cat > /etc/machine-id", input=original)
    assert drift_run()[0].returncode == 0


def test_a_removed_user_certificate_is_named_where_it_was_removed_and_where_it_breaks(converged):
    # Without its certificate node3's key is trusted nowhere: the cluster trusts the CA, not keys.
    converged.lab.ssh("node3", "rm /root/.ssh/id_trainfleet-cert.pub")
    run, report = drift_run()
    mesh = [f for f in report["findings"] if f["property"] == "ssh mesh (root)"]
    assert [f["node"] for f in mesh] == ["node3"] and "Permission denied" in mesh[0]["observed"]
    assert_detected_then_cleared(
        converged.lab, {("node3", "user certificate (root)"), ("node3", "ssh mesh (root)")}
    )


def test_a_deleted_host_certificate_is_named_on_its_node(converged):
    # The one certificate node2 presents (ed25519): sshd offers none from its next login, and the
    # others, trusting the CA alone, can no longer verify node2.
    converged.lab.ssh("node2", "rm /etc/ssh/ssh_host_ed25519_key-cert.pub")
    assert_detected_then_cleared(
        converged.lab,
        {
            ("node2", "host certificates"),
            ("node1", "ssh mesh (root)"),
            ("node3", "ssh mesh (root)"),
        },
    )


def test_a_node_lost_in_the_middle_of_a_deploy_is_named_with_what_happened_and_the_step(converged):
    """node2 has one file to change; a process this test starts there holds the node's lock,
    so the deploy's write waits inside that step until node2 goes away (no sleep race)."""
    lab = converged.lab
    lab.ssh("node2", "sed -i 's/^198.18.0.13 /198.18.0.99 /' /etc/hosts")
    lab.ssh(
        "node2",
        "mkdir -p -m 700 /run/trainfleet; "
        "setsid flock /run/trainfleet/lock sleep 300 </dev/null >/dev/null 2>&1 &",
    )
    deploy = subprocess.Popen(
        [PYINFRA, "-y", "--json", LAB_INVENTORY, CLUSTER],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not lab.ssh("node2", "pgrep -f '^flock -w [0-9]+ 9$' || true").strip():
            assert deploy.poll() is None and time.monotonic() < deadline, (
                "the deploy never waited on node2"
            )
            time.sleep(0.2)
        lab.lab.stop("node2")  # every process of node2 ends, its sshd's sessions with them
        stdout, stderr = deploy.communicate(timeout=300)
    finally:
        if deploy.poll() is None:
            deploy.kill()
        lab.lab.start("node2")
    assert deploy.returncode != 0
    lost = [line for line in stderr.splitlines() if "[node2]" in line and "trainfleet:" in line]
    step = "'Cluster hosts block in /etc/hosts'"
    assert any("connection lost" in line and step in line for line in lost), stderr[-3000:]
    report = json.loads(stdout[stdout.find("{") :])  # node1 and node3 went on to the end
    assert {h for op in report["results"]["operations"] for h in op["error"]} == {"node2"}
    run = pyinfra(LAB_INVENTORY, CLUSTER)  # back, node2 converges too
    assert run.returncode == 0, run.describe()
    assert (
        set(run.changed()) == {"Cluster hosts block in /etc/hosts"}
        and drift_run()[0].returncode == 0
    )


def test_a_node_down_is_named_unreachable(converged):
    lab = converged.lab
    lab.lab.stop("node2")
    try:
        run, report = drift_run()
        assert run.returncode != 0
        assert ("node2", "reachable") in findings(report)
        assert report["nodes"]["node2"]["reachable"] is False
        assert "[node2] Could not connect" in run.stderr
    finally:
        lab.lab.start("node2")
    run, report = drift_run()
    assert run.returncode == 0 and not report["drift"], report["findings"]
