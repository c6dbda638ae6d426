"""The NCCL environment on real nodes that each have a decoy NIC listed before the cluster one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.lab.harness import LAB_INVENTORY, deploy_twice, fact, pyinfra

DEPLOY = "deploy/cluster.py"
NODES = ["node1", "node2", "node3"]
# UCX_NET_DEVICES: OpenMPI's UCX layer on the same interface (no InfiniBand in the lab).
EXPECTED = {
    "NCCL_SOCKET_IFNAME": "=eth0",
    "GLOO_SOCKET_IFNAME": "eth0",
    "NCCL_IB_DISABLE": "1",
    "UCX_NET_DEVICES": "eth0",
}


@pytest.fixture(scope="module")
def nccl(lab):
    lab.fresh(3)  # every node: eno1 (decoy, 198.18.0.128/25) created before eth0 (cluster)
    first, _ = deploy_twice(LAB_INVENTORY, DEPLOY)
    return SimpleNamespace(lab=lab, first=first)


def test_a_naive_choice_would_pick_the_decoy_which_no_peer_can_reach(nccl):
    lab = nccl.lab
    listed = [line.split()[1] for line in lab.ssh("node1", "ip -o -4 addr show").splitlines()]
    assert listed.index("eno1") < listed.index("eth0")
    # The trap is real: a peer cannot reach node1 at its decoy address, only at its cluster one.
    probe = "timeout 2 bash -c '</dev/tcp/{}/22' 2>/dev/null && echo open || echo closed"
    assert lab.ssh("node2", probe.format("198.18.0.139")).strip() == "closed"
    assert lab.ssh("node2", probe.format("198.18.0.11")).strip() == "open"


def test_every_node_sees_the_cluster_interface_in_login_and_non_login_shells(nccl):
    assert (
        sorted(
            nccl.first.changed()["NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)"]
        )
        == NODES
    )
    seen = fact(LAB_INVENTORY, "facts.nccl_env_facts.NcclEnvSeen")
    for node in NODES:
        assert seen[node]["non_login"] == EXPECTED, node
        assert seen[node]["login"] == EXPECTED, node
        conf = nccl.lab.host(node).file("/etc/nccl.conf").content_string
        assert "NCCL_SOCKET_IFNAME==eth0\n" in conf and "GLOO_SOCKET_IFNAME" not in conf


def test_ranks_started_by_ssh_and_pdsh_get_the_variables(nccl):
    lab = nccl.lab
    for node in NODES:  # `ssh nodeX env`: the non-login shell mpirun and DeepSpeed's runner use
        env = dict(line.split("=", 1) for line in lab.ssh(node, "env").splitlines() if "=" in line)
        assert {k: env.get(k) for k in EXPECTED} == EXPECTED
    lines = sorted(
        lab.ssh("node1", "pdsh -a 'echo $NCCL_SOCKET_IFNAME $GLOO_SOCKET_IFNAME'").splitlines()
    )
    assert lines == [f"{node}: =eth0 eth0" for node in NODES]


def test_launchers_forward_only_what_is_the_same_on_every_node(nccl):
    files = nccl.lab.read(
        "node1", ["/etc/trainfleet/launch/.deepspeed_env", "/etc/trainfleet/launch/mpirun.sh"]
    )
    # Same names on every lab node: safe to forward; no blank or comment lines (DeepSpeed's parser).
    assert files["/etc/trainfleet/launch/.deepspeed_env"].splitlines() == [
        "GLOO_SOCKET_IFNAME=eth0",
        "NCCL_IB_DISABLE=1",
        "NCCL_SOCKET_IFNAME==eth0",
        "UCX_NET_DEVICES=eth0",
    ]
    assert (
        "-x GLOO_SOCKET_IFNAME -x NCCL_IB_DISABLE -x NCCL_SOCKET_IFNAME -x UCX_NET_DEVICES"
        in files["/etc/trainfleet/launch/mpirun.sh"]
    )


def test_an_interface_the_node_lacks_fails_that_node_and_writes_nothing(nccl, tmp_path):
    lab = nccl.lab
    files = ["/etc/profile.d/trainfleet-nccl.sh", "/etc/nccl.conf"]
    before = lab.read("node3", files)
    assert all(before.values()), before
    variant = lab.spec_inventory(
        tmp_path, node_settings={"node3": {"nccl": {"socket_ifname": "=ens9"}}}
    )

    run = pyinfra(variant, DEPLOY)

    assert run.returncode != 0
    assert run.errors()["NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)"] == [
        "node3"
    ]
    assert "[node3]" in run.stderr and "names ens9, which this node does not have" in run.stderr
    assert lab.read("node3", files) == before
    deploy_twice(LAB_INVENTORY, DEPLOY)
