"""OpenMPI on real nodes that each have a decoy NIC listed before the cluster one: installed
by the deploy at the spec's exact version and held, mpirun from node1 over the SSH mesh, its
network pinned from the same facts as NCCL; and stale System V shared memory, reported by
node and removed only on request.

OpenMPI is Debian 12's openmpi-bin, which the nodes install from the host's apt cache
(`make host-deps` downloads it): `stack.openmpi` pins it, nothing is installed by hand.
"""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from checks.drift_check import report_path
from tests.lab.harness import deploy_twice, fact, pyinfra

DEPLOY = "deploy/cluster.py"
CLEANUP = "deploy/shm_cleanup.py"
NODES = ["node1", "node2", "node3"]
OP = "OpenMPI network (~/.openmpi/mca-params.conf)"
MCA_FILE = "/root/.openmpi/mca-params.conf"
USER_LINE = "mpi_show_mca_params = enviro"  # the admin's own line on node2: kept, below the block
OPENMPI = "4.1.4-3+b1"  # Debian 12's openmpi-bin, as `apt-cache policy openmpi-bin` shows it
STACK_OP = "Pinned software stack (CUDA, cuDNN, NCCL, OpenMPI, GCC, PyTorch)"
# Each rank prints where it runs and the UCX device its node gave it; bounded: never a hang.
EVERY_RANK = (
    "timeout 90 /etc/trainfleet/launch/mpirun.sh sh -c 'echo $(hostname) ${UCX_NET_DEVICES:-unset}'"
)


@pytest.fixture(scope="module")
def mpi(lab, tmp_path_factory):
    lab.fresh(3)
    assert lab.ssh("node1", "command -v mpirun || echo none").strip() == "none"
    lab.ssh("node2", f"mkdir -p /root/.openmpi && echo '{USER_LINE}' > {MCA_FILE}")
    inventory = lab.spec_inventory(tmp_path_factory.mktemp("openmpi"), stack={"openmpi": OPENMPI})
    first, _ = deploy_twice(inventory, DEPLOY)
    return SimpleNamespace(lab=lab, first=first, inventory=inventory)


def test_the_deploy_installs_exactly_the_pinned_openmpi_and_holds_it(mpi):
    lab = mpi.lab
    assert sorted(mpi.first.changed()[STACK_OP]) == NODES
    for node in NODES:
        host = lab.host(node)
        assert host.package("openmpi-bin").version == OPENMPI
        assert "openmpi-bin" in host.check_output("apt-mark showhold").split()
        assert lab.ssh(node, "mpirun --version | head -n 1").strip() == "mpirun (Open MPI) 4.1.4"
    drift = pyinfra(mpi.inventory, "deploy/drift.py")
    assert drift.returncode == 0, drift.describe()
    seen = json.loads(report_path("lab").read_text())["nodes"]
    assert {node: seen[node]["properties"]["package openmpi-bin"] for node in NODES} == {
        n: OPENMPI for n in NODES
    }


def test_every_node_pins_openmpi_to_the_cluster_interface_and_openmpi_reads_it(mpi):
    lab = mpi.lab
    assert sorted(mpi.first.changed()[OP]) == NODES
    for node in NODES:
        lines = lab.host(node).file(MCA_FILE).content_string.splitlines()
        assert "btl_tcp_if_include = eth0" in lines and "oob_tcp_if_include = eth0" in lines
        # OpenMPI itself, not our parser: ompi_info reports the value and that it came from a file.
        info = lab.ssh(
            node, "ompi_info --parsable --param btl tcp --level 9 | grep ':btl_tcp_if_include:'"
        )
        assert "btl_tcp_if_include:value:eth0" in info, info
        assert "btl_tcp_if_include:source:file" in info, info
    assert lab.host("node2").file(MCA_FILE).content_string.splitlines()[-1] == USER_LINE


def test_mpirun_from_node1_runs_a_rank_on_every_node_despite_the_decoy(mpi):
    lab = mpi.lab
    assert "eno1" in lab.ssh("node1", "ip -o -4 addr show")  # the NIC no peer can reach is there
    script = lab.host("node1").file("/etc/trainfleet/launch/mpirun.sh").content_string
    assert "--mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0" in script
    out = lab.ssh("node1", EVERY_RANK, timeout=120)
    assert sorted(out.splitlines()) == [f"{node} eth0" for node in NODES]


def test_a_stale_segment_is_reported_for_its_node_and_removed_only_on_request(mpi):
    lab = mpi.lab
    shmid = int(lab.ssh("node2", "ipcmk -M 65536").split(":")[1])  # created, then nobody attached

    seen = fact(mpi.inventory, "facts.shm_facts.StaleSharedMemory")
    assert [(s["shmid"], s["bytes"]) for s in seen["node2"]] == [(shmid, 65536)]
    assert seen["node1"] == [] and seen["node3"] == []

    # The cluster deploy never removes it; neither does the cleanup while it is younger than its
    # bound.
    deploy = pyinfra(mpi.inventory, DEPLOY)
    assert deploy.returncode == 0 and deploy.changed() == {}, deploy.describe()
    young = pyinfra(mpi.inventory, CLEANUP)
    assert young.returncode == 0 and young.changed() == {}
    assert str(shmid) in lab.ssh("node2", "ipcs -m")

    first, _ = deploy_twice(mpi.inventory, CLEANUP, data={"trainfleet_shm_min_idle": "0"})
    assert list(first.changed().values()) == [["node2"]]
    assert str(shmid) not in lab.ssh("node2", "ipcs -m")


def test_differing_interface_names_pin_openmpi_to_the_cluster_subnet(mpi):
    lab = mpi.lab
    # node3's cluster NIC becomes ens5 (renamed from the host, in the node's own namespace).
    netns = lab.lab.node("node3").netns
    for step in (
        ["link", "set", "eth0", "down"],
        ["link", "set", "eth0", "name", "ens5"],
        ["link", "set", "ens5", "up"],
    ):
        subprocess.run(["ip", "-n", netns, *step], check=True)

    first, _ = deploy_twice(mpi.inventory, DEPLOY)

    assert sorted(first.changed()[OP]) == NODES
    for node in NODES:
        mca = lab.host(node).file(MCA_FILE).content_string.splitlines()
        assert "btl_tcp_if_include = 198.18.0.0/24" in mca
    launcher = lab.host("node1").file("/etc/trainfleet/launch/mpirun.sh")
    assert "--mca oob_tcp_if_include 198.18.0.0/24" in launcher.content_string
    out = lab.ssh("node1", EVERY_RANK, timeout=120)
    # UCX_NET_DEVICES differs now, so it is not forwarded: each rank has its own node's value.
    assert sorted(out.splitlines()) == ["node1 eth0", "node2 eth0", "node3 ens5"]
