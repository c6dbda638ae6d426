"""A cluster whose sshd refuses root (`PermitRootLogin no`), reached as an admin with
passwordless sudo (`ssh.become: sudo`): the deploy, drift and the preflight all work through
sudo, twice, the second run changing nothing; a login without sudo, or whose sudo lets only
`id` through without a password, gets one clear error per node, never a password prompt or a
hang, and nothing on the node changes."""

from __future__ import annotations

import json

import pytest

from checks.drift_check import report_path as drift_report
from checks.preflight_check import report_path as preflight_report
from tests.lab.conftest import converged_torch_lab
from tests.lab.harness import TORCH_STACK, deploy_twice, on_every_node, pyinfra

NODES = ["node1", "node2", "node3"]
ADMIN, STRANGER, NARROW = "admin", "nosudo", "narrow"

# Three users with the operator's key: admin may sudo without a password, nosudo may not,
# narrow may run only `id` without one (a proof by `sudo id` would pass); then sshd stops
# taking root (the listener re-reads its config on HUP; open sessions stay).
HARDEN = f"""set -e
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-download sudo >/dev/null 2>&1
for u in {ADMIN} {STRANGER} {NARROW}; do
  useradd -m -s /bin/sh "$u"
  install -d -m 700 -o "$u" -g "$u" "/home/$u/.ssh"
  install -m 600 -o "$u" -g "$u" /root/.ssh/authorized_keys "/home/$u/.ssh/authorized_keys"
done
echo '{ADMIN} ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/trainfleet-lab-admin
echo '{NARROW} ALL=(ALL:ALL) ALL' > /etc/sudoers.d/trainfleet-lab-narrow
echo '{NARROW} ALL=(ALL:ALL) NOPASSWD:SETENV: /usr/bin/id' >> /etc/sudoers.d/trainfleet-lab-narrow
chmod 440 /etc/sudoers.d/trainfleet-lab-admin /etc/sudoers.d/trainfleet-lab-narrow
visudo -c >/dev/null
echo 'PermitRootLogin no' > /etc/ssh/sshd_config.d/00-trainfleet-lab.conf
kill -HUP "$(pgrep -o -x sshd)"
# sshd re-executes itself on SIGHUP, its port closed meanwhile: the next login waits for it
sleep 0.3
for _ in $(seq 50); do ss -Hltn 'sport = :22' | grep -q . && break; sleep 0.1; done
"""
# What trainfleet manages, checksummed as the admin sees it through sudo (a file not made yet
# is named as missing: the same answer before and after a run that changed nothing).
MANAGED = (
    "sudo -n sha256sum /etc/hosts /etc/hostname /etc/ssh/ssh_known_hosts /etc/environment "
    "/etc/nccl.conf /etc/genders /etc/trainfleet/launch/* /home/admin/.ssh/* 2>&1; true"
)


@pytest.fixture(scope="module")
def sudo_lab(lab, tmp_path_factory):
    # The torch lab the modules before this one converged (the stack is not installed again),
    # hardened: root refused from here on, so no later test may share it.
    lab, _ = converged_torch_lab(lab, tmp_path_factory)
    lab.prepared = None
    on_every_node(lab, NODES, HARDEN)
    workdir = tmp_path_factory.mktemp("sudo")
    admin = lab.spec_inventory(
        workdir,
        cluster={"mesh_users": [ADMIN]},
        ssh={"user": ADMIN, "become": "sudo"},
        stack=TORCH_STACK,
    )
    stranger_dir = tmp_path_factory.mktemp("nosudo")
    stranger = lab.spec_inventory(
        stranger_dir, cluster={"mesh_users": [ADMIN]}, ssh={"user": STRANGER, "become": "sudo"}
    )
    narrow = lab.spec_inventory(
        tmp_path_factory.mktemp("narrow"),
        cluster={"mesh_users": [ADMIN]},
        ssh={"user": NARROW, "become": "sudo"},
    )
    return lab, admin, {STRANGER: stranger, NARROW: narrow}


def test_root_cannot_log_in_but_the_admin_and_the_stranger_can(sudo_lab):
    lab, _, _ = sudo_lab
    for node in NODES:
        with pytest.raises(AssertionError, match="Permission denied"):
            lab.ssh(node, "true")
        assert lab.ssh(node, "id -un", user=ADMIN).strip() == ADMIN
        assert lab.ssh(node, "sudo -n id -u", user=ADMIN).strip() == "0"
        assert lab.ssh(node, "id -un", user=STRANGER).strip() == STRANGER
        # narrow's rule lets `sudo -n -E id` through (a proof of that form would pass), not sh
        assert lab.ssh(node, "sudo -n -E id -u", user=NARROW).strip() == "0"
        assert "a password is required" in lab.ssh(
            node, "sudo -H -n -E sh -c 'id -u' 2>&1; true", user=NARROW
        )


def test_the_whole_deploy_drift_and_preflight_run_as_a_sudo_admin_twice_without_change(sudo_lab):
    lab, admin, _ = sudo_lab
    first, second = deploy_twice(admin, "deploy/cluster.py")
    assert first.changed(), "the first run as the admin changed nothing"
    assert first.errors() == {}

    for node in NODES:
        assert lab.ssh(node, "hostname", user=ADMIN).strip() == node
        # The mesh user's key, written through sudo as the user, is the user's and 0600;
        # nothing was left in the upload directory the secret went through.
        host = lab.host(node, user=ADMIN)
        key = host.file(f"{host.user().home}/.ssh/id_trainfleet")
        assert key.is_file and (key.user, key.mode) == (ADMIN, 0o600)
        upload = host.file(f"/run/trainfleet-upload.{ADMIN}")
        assert upload.is_directory and (upload.user, upload.mode) == (ADMIN, 0o700)
        assert host.check_output("ls -A -- %s", upload.path) == ""  # dotfiles included
    # The admin's mesh: every node reaches every node by name, host keys verified.
    assert lab.ssh("node1", "ssh -o BatchMode=yes node3 hostname", user=ADMIN).strip() == "node3"

    before = {n: lab.ssh(n, MANAGED, user=ADMIN) for n in NODES}
    drift = pyinfra(admin, "deploy/drift.py")
    assert drift.returncode == 0, drift.describe()
    report = json.loads(drift_report("lab").read_text())
    assert report["drift"] is False, report["findings"]
    assert set(report["nodes"]) == set(NODES) and all(
        n["reachable"] for n in report["nodes"].values()
    )

    preflight = pyinfra(admin, "deploy/preflight.py", timeout=400)
    assert preflight.returncode == 0, preflight.describe()
    verdict = json.loads(preflight_report("lab").read_text())
    assert verdict["ok"] is True, verdict["problems"]
    assert "failed" not in verdict["stages"].values() and "collective" in verdict["stages"], (
        verdict["stages"]
    )
    assert {n: lab.ssh(n, MANAGED, user=ADMIN) for n in NODES} == before, (
        "drift or the preflight changed a node"
    )


@pytest.mark.parametrize("login", [STRANGER, NARROW])
def test_a_login_without_sudo_gets_one_clear_error_per_node_and_changes_nothing(sudo_lab, login):
    lab, admin, logins = sudo_lab
    before = {n: lab.ssh(n, MANAGED, user=ADMIN) for n in NODES}

    # Every entry point proves sudo before anything runs through it: the deploy, drift and
    # the preflight (whose first stage would otherwise run through sudo and prompt).
    for deploy in ("deploy/cluster.py", "deploy/drift.py", "deploy/preflight.py"):
        run = pyinfra(logins[login], deploy, timeout=120)

        assert run.returncode != 0, run.describe()
        for node in NODES:
            lines = [
                line
                for line in run.stderr.splitlines()
                if f"[{node}]" in line and f"{login} cannot act as root without a password" in line
            ]
            assert len(lines) == 1, run.describe()
            assert "sudo -n said: " in lines[0] and "sudo: a password is required" in lines[0]
        assert "sudo password:" not in run.stdout + run.stderr  # pyinfra never prompted
    assert {n: lab.ssh(n, MANAGED, user=ADMIN) for n in NODES} == before
