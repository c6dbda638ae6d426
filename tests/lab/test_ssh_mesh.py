"""SSH mesh, pdsh and launcher configs on real nodes over real SSH, each deploy run twice."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.lab.harness import LAB_INVENTORY, REPO, deploy_twice, fact, pyinfra, readmit
from trainfleet.keystore import KeyStore

DEPLOY = "deploy/cluster.py"
NODES = ["node1", "node2", "node3"]
ADDRESSES = {"node1": "198.18.0.11", "node2": "198.18.0.12", "node3": "198.18.0.13"}
USER_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxyz0r8Xx5D4qfXWm1VCxXJtVXr8vC2Dq9yHk0tRvJq "
    "alice@laptop\n"
)
USER_CONFIG = "Host bastion\n    HostName 192.0.2.200\n    User alice\n"


def mesh_matrix(lab, nodes=NODES) -> dict[str, dict[str, str]]:
    """What a user sees: `ssh peer hostname` from every node to every node, by name ('' =
    failed)."""
    probe = "; ".join(
        f"echo {dst}=$(ssh -o BatchMode=yes {dst} hostname 2>/dev/null)" for dst in nodes
    )
    return {
        src: dict(line.split("=", 1) for line in lab.ssh(src, probe).splitlines()) for src in nodes
    }


def outside_block(text: str, purpose: str) -> list[str]:
    lines = text.splitlines()
    begin = f"# BEGIN trainfleet managed block: {purpose} (do not edit)"
    end = f"# END trainfleet managed block: {purpose}"
    if begin not in lines:
        return lines
    return lines[: lines.index(begin)] + lines[lines.index(end) + 1 :]


@pytest.fixture(scope="module")
def mesh(lab):
    """One fresh lab for this module, with user content seeded, converged twice.

    Tests below start from (and leave) this converged state; each changes only what it restores.
    """
    lab.fresh(3)
    lab.ssh("node2", "cat >> /root/.ssh/authorized_keys", input=USER_KEY)
    lab.ssh("node2", "cat > /root/.ssh/config && chmod 600 /root/.ssh/config", input=USER_CONFIG)
    node2 = lab.host("node2")
    before = {
        f: node2.file(f"/root/.ssh/{f}").content_string for f in ("authorized_keys", "config")
    }
    first, second = deploy_twice(LAB_INVENTORY, DEPLOY)
    return SimpleNamespace(lab=lab, before=before, first=first, second=second)


def test_mesh_pdsh_and_launchers_converge_keep_user_content_and_rerun_changes_nothing(mesh):
    lab3, before, first, second = mesh.lab, mesh.before, mesh.first, mesh.second

    assert sorted(first.changed()["SSH mesh for root"]) == NODES
    # Every node reaches every node (itself included) by name, host keys verified.
    assert mesh_matrix(lab3) == {src: {dst: dst for dst in NODES} for src in NODES}
    proof = fact(
        LAB_INVENTORY, "facts.ssh_mesh_facts.SshMeshProof", "user=root", "peers=" + ",".join(NODES)
    )
    assert proof == {src: {dst: "ok" for dst in NODES} for src in NODES}
    # The user's own key and Host entry are byte-for-byte where they were.
    node2 = lab3.host("node2")
    after_keys = node2.file("/root/.ssh/authorized_keys").content_string
    after_config = node2.file("/root/.ssh/config").content_string
    assert after_keys.startswith(before["authorized_keys"])
    assert outside_block(after_keys, "ssh mesh keys") == before["authorized_keys"].splitlines()
    assert outside_block(after_config, "ssh mesh hosts") == before["config"].splitlines()
    # Keys: 0600 on the nodes and in the controller's store, never printed.
    node1 = lab3.host("node1")
    ssh_dir, key = node1.file("/root/.ssh"), node1.file("/root/.ssh/id_trainfleet")
    assert ssh_dir.is_directory and (ssh_dir.user, ssh_dir.mode) == ("root", 0o700)
    assert key.is_file and (key.user, key.mode) == ("root", 0o600)
    store = KeyStore("lab")
    for node in NODES:
        private = store.keypair("root", node).private
        assert private not in first.stdout + first.stderr + second.stdout + second.stderr
        assert stat.S_IMODE(os.stat(store.dir / "root" / node).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store.dir).st_mode) == 0o700
    # pdsh -a, over ssh, reaches the whole cluster.
    pdsh = sorted(lab3.ssh("node1", "pdsh -a hostname").splitlines())
    assert pdsh == [f"{n}: {n}" for n in NODES]


def test_launcher_files_match_the_spec_on_every_node(mesh):
    lab3 = mesh.lab
    for rank, node in enumerate(NODES):
        names = ("hostfile", "colossalai_hostfile", "accelerate.yaml", "torchrun.sh", "mpirun.sh")
        read = lab3.read(node, [f"/etc/trainfleet/launch/{name}" for name in names])
        files = {name: read[f"/etc/trainfleet/launch/{name}"] for name in names}
        assert files["hostfile"] == "".join(
            f"{n} slots=1\n" for n in NODES
        )  # gpus: 0 -> one CPU process
        assert files["colossalai_hostfile"] == "".join(f"{n}\n" for n in NODES)
        config = yaml.safe_load(files["accelerate.yaml"])
        assert config["machine_rank"] == rank
        assert config["num_machines"] == 3 and config["num_processes"] == 3
        assert (
            config["main_process_ip"] == ADDRESSES["node1"] and config["main_process_port"] == 29500
        )
        assert config["rdzv_backend"] == "static" and config["same_network"] is True
        assert (
            config["mixed_precision"] == "no" and config["downcast_bf16"] == "no"
        )  # strings, not False
        assert (
            f"--node-rank={rank} --master-addr=198.18.0.11 --master-port=29500"
            in files["torchrun.sh"]
        )
        assert "--hostfile /etc/trainfleet/launch/hostfile -np 3" in files["mpirun.sh"]
        assert lab3.host(node).file("/etc/trainfleet/launch/torchrun.sh").mode == 0o755


def test_an_unreachable_node_is_named_and_converges_on_a_later_run(mesh, tmp_path):
    lab3 = mesh.lab
    # A node joins the cluster while another is down: the reachable ones converge.
    deploy_twice(lab3.spec_inventory(tmp_path, keep=["node1", "node2"]), DEPLOY)
    lab3.lab.stop("node3")

    run = pyinfra(LAB_INVENTORY, DEPLOY)

    assert run.returncode != 0
    assert "[node3] Could not connect" in run.stderr
    # A certificate mesh: a node joining changes none of the others' SSH files.
    assert not {op for op in run.changed() if "mesh" in op or "known_hosts" in op}, run.changed()
    assert mesh_matrix(lab3, ["node1", "node2"]) == {
        s: {d: d for d in ("node1", "node2")} for s in ("node1", "node2")
    }
    # node3 stays trusted by the others: the one CA line names it with every node.
    assert (
        lab3.ssh("node1", "grep -c '^@cert-authority node?,' /etc/ssh/ssh_known_hosts").strip()
        == "1"
    )

    lab3.lab.start("node3")
    krl_digest = "sha256sum /etc/ssh/trainfleet_revoked_keys"
    krl = {node: lab3.ssh(node, krl_digest) for node in ("node1", "node2")}
    back = pyinfra(LAB_INVENTORY, DEPLOY)
    # node3 left the spec above, so the host keys it presents again are revoked: it is named,
    # and its return changes nothing on the others (their KRL byte for byte).
    assert back.returncode != 0 and "which the cluster revoked" in back.stderr, back.describe()
    assert {host for hosts in back.errors().values() for host in hosts} == {"node3"}, back.errors()
    elsewhere = {op for op, hosts in back.changed().items() if {"node1", "node2"} & set(hosts)}
    assert not elsewhere, back.changed()
    assert {node: lab3.ssh(node, krl_digest) for node in krl} == krl
    readmit(lab3, "node3")  # the operator's word: its old host keys are safe
    deploy_twice(LAB_INVENTORY, DEPLOY)
    assert mesh_matrix(lab3) == {src: {dst: dst for dst in NODES} for src in NODES}


def test_a_removed_node_loses_its_key_everywhere(mesh, tmp_path):
    lab3 = mesh.lab
    node3_key = KeyStore("lab").keypair("root", "node3").public

    deploy_twice(lab3.spec_inventory(tmp_path, keep=["node1", "node2"]), DEPLOY)

    for node in ("node1", "node2"):
        host = lab3.host(node)
        assert node3_key not in host.file("/root/.ssh/authorized_keys").content_string
        # Its key (and so its still valid certificate) is refused by every remaining node's sshd.
        assert (
            lab3.ssh(
                node,
                f"echo '{node3_key}' > /run/node3.pub; ssh-keygen -Q -f "
                "/etc/ssh/trainfleet_revoked_keys /run/node3.pub; echo rc=$?",
            ).split()[-1]
            == "rc=1"
        )
        assert "Host node3" not in host.file("/root/.ssh/config").content_string
        assert "node3" not in lab3.ssh(node, "pdsh -a hostname")
    readmit(lab3, "node3")  # its host keys were revoked when it left the spec
    deploy_twice(LAB_INVENTORY, DEPLOY)  # back to the whole cluster


def test_a_revoked_node_can_no_longer_reach_its_peers_until_rotated_back(mesh):
    lab3 = mesh.lab
    keys_cli = [sys.executable, "-m", "trainfleet", "keys"]
    subprocess.run([*keys_cli, "revoke", str(lab3.lab.spec), "node2"], check=True, cwd=REPO)

    deploy_twice(LAB_INVENTORY, DEPLOY)

    assert lab3.ssh("node2", "ls /root/.ssh/id_trainfleet", check=False) == ""
    matrix = mesh_matrix(lab3)
    assert matrix["node2"]["node1"] == "" and matrix["node2"]["node3"] == ""
    assert matrix["node1"]["node2"] == "node2" and matrix["node3"]["node1"] == "node1"

    subprocess.run([*keys_cli, "rotate", str(lab3.lab.spec), "node2"], check=True, cwd=REPO)
    deploy_twice(LAB_INVENTORY, DEPLOY)
    assert mesh_matrix(lab3) == {src: {dst: dst for dst in NODES} for src in NODES}
    assert Path(KeyStore("lab").dir / "root" / "node2").exists()
