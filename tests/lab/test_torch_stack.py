"""PyTorch pinned in every node's venv from a wheelhouse, as on an air-gapped cluster."""

from __future__ import annotations

import json

from checks.drift_check import report_path
from tests.lab.harness import TORCH_STACK, deploy_twice, fact, pyinfra

NODES = ["node1", "node2", "node3"]
OP = "Pinned software stack (CUDA, cuDNN, NCCL, OpenMPI, GCC, PyTorch)"
VENV_PYTHON = "/opt/trainfleet/venv/bin/python"


def test_every_node_imports_the_pinned_torch_and_a_rerun_changes_nothing(torch_lab):
    lab, inventory = torch_lab
    assert sorted(lab.torch_first_run.changed()[OP]) == NODES
    for node in NODES:
        out = lab.ssh(
            node,
            f"{VENV_PYTHON} -c 'import torch; print(torch.__version__, "
            "torch.distributed.is_available())'",
        )
        assert out.split()[-2:] == ["2.13.0+cpu", "True"], node
    versions = fact(inventory, "facts.stack_facts.StackVersions", "venv=/opt/trainfleet/venv")
    assert {n: v["torch"]["version"] for n, v in versions.items()} == {
        n: "2.13.0+cpu" for n in NODES
    }
    assert all(v["torch"]["gpu"] is False for v in versions.values())


def test_a_different_torch_pin_is_refused_not_silently_applied(torch_lab, tmp_path):
    lab, _ = torch_lab
    other = lab.spec_inventory(tmp_path, stack={**TORCH_STACK, "torch": "2.12.0"})

    run = pyinfra(other, "deploy/cluster.py")

    assert run.returncode != 0
    # Every node fails (pyinfra then ends with "No hosts remaining" and no JSON results).
    for node in NODES:
        assert (
            f"[{node}] trainfleet: torch_venv: /opt/trainfleet/venv has torch 2.13.0+cpu, "
            "the pin is 2.12.0+cpu; not replacing it"
        ) in run.stderr, run.describe()
    assert (
        lab.ssh("node1", f"{VENV_PYTHON} -c 'import torch; print(torch.__version__)'").split()[-1]
        == "2.13.0+cpu"
    )


def test_drift_names_the_node_whose_torch_differs_and_the_deploy_restores_it(torch_lab):
    lab, inventory = torch_lab
    lab.ssh("node2", f"{VENV_PYTHON} -m pip uninstall -q -y torch")

    run = pyinfra(inventory, "deploy/drift.py")

    report = json.loads(report_path("lab").read_text())
    assert run.returncode != 0
    torch_findings = {
        (f["node"], f["kind"], f["observed"])
        for f in report["findings"]
        if f["property"] == "torch"
    }
    assert torch_findings == {("node2", "spec", "absent")}

    # A job running from the venv on node2 (numpy's extension module loaded from it): the
    # deploy does not put torch back under it, says which node and why, and changes nothing.
    job = lab.ssh(
        "node2",
        f"setsid {VENV_PYTHON} -c 'import numpy, time; time.sleep(300)' </dev/null >/dev/null "
        "2>&1 & echo $!",
    ).strip()
    lab.ssh(
        "node2",
        f"for i in $(seq 100); do grep -q -F /opt/trainfleet/venv/ /proc/{job}/maps && exit 0; "
        "sleep 0.1; done; exit 1",
    )
    try:
        held = pyinfra(inventory, "deploy/cluster.py")
        assert held.returncode == 0 and held.changed() == {}, held.describe()
        assert (
            f"[node2] not changing the stack under a running job (pids from the venv: {job})"
            in held.stdout + held.stderr
        )
        torch_dir = "/opt/trainfleet/venv/lib/python3.11/site-packages/torch"
        assert not lab.host("node2").file(torch_dir).exists
    finally:
        lab.ssh("node2", f"kill {job}")  # the process this test started, by its pid
    deploy_twice(inventory, "deploy/cluster.py")
    assert pyinfra(inventory, "deploy/drift.py").returncode == 0
