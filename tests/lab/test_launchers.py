"""Every launcher the cluster is configured for starts a real job: the smoke job
(/etc/trainfleet/launch/smoke_train.py, two DDP steps, an all_reduce and the weights checked)
through each generated launch file, on the torch-pinned 3-node lab whose accelerate, DeepSpeed,
ColossalAI and OpenMPI the deploy installed; one rank per node, all of them reporting success,
within a bound, nothing left running."""

from __future__ import annotations

import json
import time

import pytest

from checks.preflight_check import report_path
from tests.lab.harness import on_every_node, pyinfra
from trainfleet.stamps import stamps_path

NODES = ["node1", "node2", "node3"]
LAUNCH = "/etc/trainfleet/launch"
SMOKE = f"{LAUNCH}/smoke_train.py"
BOUND = 150  # seconds for one launch, DeepSpeed's imports included
LEFTOVERS = "pgrep -f '[s]moke_train.py' || true"


def ranks(output: str) -> list[dict]:
    """The smoke job's one JSON line per rank, wherever the launcher put it (pdsh prefixes
    'node2: ', accelerate and DeepSpeed add their own lines)."""
    found = []
    for line in output.splitlines():
        start = line.find('{"smoke"')
        if start >= 0:
            found.append(json.loads(line[start:]))
    return found


def assert_trained_on_every_node(found: list[dict]) -> None:
    assert sorted(r["host"] for r in found) == NODES, found
    assert sorted(r["rank"] for r in found) == [0, 1, 2], found
    for r in found:
        assert (
            r["smoke"],
            r["world"],
            r["backend"],
            r["all_reduce"],
            r["weights_equal"],
            r["steps"],
        ) == ("ok", 3, "gloo", 6.0, True, 2), r


def assert_nothing_left_running(lab) -> None:
    for node in NODES:
        assert lab.ssh(node, LEFTOVERS).strip() == "", f"smoke job processes left on {node}"


def launched(lab, command: str, everywhere: bool) -> list[dict]:
    started = time.monotonic()
    bounded = f"timeout -k 5 {BOUND} {command} 2>/dev/null"
    if everywhere:
        out = "\n".join(on_every_node(lab, NODES, bounded, timeout=BOUND + 30).values())
    else:
        out = lab.ssh("node1", bounded, timeout=BOUND + 30)
    assert time.monotonic() - started < BOUND
    assert_nothing_left_running(lab)
    return ranks(out)


def test_torchrun_sh_on_every_node_trains(torch_lab):
    lab, _ = torch_lab
    assert_trained_on_every_node(launched(lab, f"{LAUNCH}/torchrun.sh {SMOKE}", everywhere=True))


def test_mpirun_sh_from_node1_trains_with_the_deployed_openmpi(torch_lab):
    lab, _ = torch_lab
    found = launched(
        lab,
        f"{LAUNCH}/mpirun.sh /opt/trainfleet/venv/bin/python {SMOKE} "
        "--master-addr 198.18.0.11 --master-port 29500",
        everywhere=False,
    )
    assert_trained_on_every_node(found)
    assert {r["launcher_env"] for r in found} == {"openmpi"}


def test_colossalai_sh_from_node1_trains_over_ssh_with_the_venv_on_the_path(torch_lab):
    lab, _ = torch_lab
    # ColossalAI runs a bare `torchrun` on every host in the directory it was started in.
    assert_trained_on_every_node(
        launched(lab, f"sh -c 'cd /root && {LAUNCH}/colossalai.sh {SMOKE}'", everywhere=False)
    )
    # A host whose key ssh does not trust is refused: node2's address under a name no
    # certificate names (fabric, with paramiko's AutoAddPolicy, logged in to it and ran the job).
    lab.ssh("node1", "echo '198.18.0.12 imposter' >> /etc/hosts")
    try:
        out = lab.ssh(
            "node1",
            f"cd /root && timeout -k 5 {BOUND} /opt/trainfleet/venv/bin/python "
            f"{LAUNCH}/colossalai_run.py run --nproc_per_node 1 --host imposter "
            f"--master_addr 198.18.0.12 --master_port 29511 {SMOKE} 2>&1",
            check=False,
            timeout=BOUND + 30,
        )
    finally:
        lab.ssh("node1", "sed -i '/ imposter$/d' /etc/hosts")
    assert "Host key verification failed" in out and not ranks(out), out[-2000:]


def test_accelerate_sh_on_every_node_trains_on_cpu_only_nodes(torch_lab):
    lab, _ = torch_lab
    assert_trained_on_every_node(launched(lab, f"{LAUNCH}/accelerate.sh {SMOKE}", everywhere=True))


@pytest.mark.parametrize("launcher", ["deepspeed", "mpirun"])
def test_the_preflight_trains_the_smoke_job_through_the_launcher_asked_for(torch_lab, launcher):
    lab, inventory = torch_lab
    run = pyinfra(
        inventory, "deploy/preflight.py", data={"trainfleet_smoke": launcher}, timeout=240
    )
    assert run.returncode == 0, run.describe()
    report = json.loads(report_path("lab").read_text())
    assert report["stages"]["smoke"] == "ok" and report["ok"] is True
    ranks = report["details"]["smoke"]["ranks"]
    assert sorted((int(rank), r["host"], r["smoke"]) for rank, r in ranks.items()) == [
        (0, "node1", "ok"),
        (1, "node2", "ok"),
        (2, "node3", "ok"),
    ]
    assert_nothing_left_running(lab)


def test_a_smoke_launcher_trainfleet_does_not_know_is_refused_before_anything_runs(torch_lab):
    lab, inventory = torch_lab
    run = pyinfra(inventory, "deploy/preflight.py", data={"trainfleet_smoke": "horovod; reboot"})
    assert run.returncode != 0
    assert (
        "trainfleet: trainfleet_smoke: 'horovod; reboot' is not one of torchrun, mpirun, "
        "deepspeed, accelerate, colossalai; nothing was run"
    ) in run.stderr
    # so is a staleness bound that is not one (no stage ran: no report, no stamps written)
    stamps = stamps_path("lab")
    before = stamps.read_bytes() if stamps.exists() else None
    run = pyinfra(inventory, "deploy/preflight.py", data={"trainfleet_stale": "6h; reboot"})
    assert run.returncode == 2
    assert (
        "trainfleet: trainfleet_stale: '6h; reboot' is not a duration: a whole number and s, m, "
        "h or d (30m, 6h, 2d); nothing was run"
    ) in run.stderr
    assert (stamps.read_bytes() if stamps.exists() else None) == before
