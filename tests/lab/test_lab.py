"""The lab itself: real isolated nodes, and a teardown that leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lab.netns import BRIDGE, PREFIX, STATE_DIR, Lab
from tests.lab.harness import REPO


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lab", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def traces() -> list[str]:
    """Everything of a lab that could outlive it: namespaces, links, mounts, files, processes."""
    found = []
    found += [
        f"netns {ns}"
        for ns in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.split()
        if ns.startswith(PREFIX)
    ]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [
        f"link {line.split(':')[1].strip()}"
        for line in links.splitlines()
        if line.split(":")[1].strip().startswith((PREFIX, BRIDGE))
    ]
    found += [
        f"mount {line.split()[4]}"
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if PREFIX in line or str(STATE_DIR) in line
    ]
    if STATE_DIR.exists():
        found.append(f"dir {STATE_DIR}")
    return found


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
        except OSError:
            continue
        assert state == "Z", f"lab process {pid} is still running"


def test_cli_up_status_ssh_and_down_leave_nothing(lab):
    lab.down()
    up = cli("up", "2", "--rails", "2")
    assert up.returncode == 0, up.stderr
    pids = [n.pid for n in Lab().nodes()]

    again = cli("up", "2")
    assert again.returncode != 0
    assert "already up" in again.stderr

    status = json.loads(cli("status", "--json").stdout)
    assert status["up"] is True
    assert [(n["name"], n["address"]) for n in status["nodes"]] == [
        ("node1", "198.18.0.11"),
        ("node2", "198.18.0.12"),
    ]

    ssh = cli("ssh", "node2", "--", "hostname")
    assert ssh.returncode == 0 and ssh.stdout.strip() == "ip-198-18-0-12"

    # --rails 2: eth1 and eth2 on subnets of their own, declared as the nodes' rails; a rail
    # reaches the same rail of a peer
    assert yaml.safe_load(Lab().spec.read_text())["preflight"] == {"rails": ["eth1", "eth2"]}
    rails = cli(
        "ssh",
        "node1",
        "--",
        "ip -4 -o addr show eth1; ip -4 -o addr show eth2; "
        "timeout 2 bash -c '</dev/tcp/198.18.12.12/22' && echo reached rail2",
    ).stdout
    assert "198.18.11.11/24" in rails and "198.18.12.11/24" in rails
    assert "reached rail2" in rails  # node2's eth2, from node1

    down = cli("down")
    assert down.returncode == 0, down.stderr
    assert traces() == []
    assert_gone(pids)
    assert cli("status").returncode != 0


def test_nodes_are_isolated_servers_with_their_own_identity(lab):
    lab.fresh(2)
    ids = {
        node: lab.host(node).file("/etc/machine-id").content_string.strip()
        for node in ("node1", "node2")
    }
    assert len(set(ids.values())) == 2
    assert (
        Path("/etc/machine-id").read_text().strip() not in ids.values()
        if Path("/etc/machine-id").exists()
        else True
    )
    host_keys = {
        node: lab.host(node).file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[1]
        for node in ("node1", "node2")
    }
    assert len(set(host_keys.values())) == 2
    node1 = lab.ssh(
        "node1",
        "ip route; cat /proc/sys/net/ipv6/conf/all/disable_ipv6; stat -c %a /root; "
        f"ls -A {STATE_DIR} | wc -l; ls -A /root/.ssh; echo $$",
    ).splitlines()
    assert not any(line.startswith("default") for line in node1), (
        "a node must have no default route"
    )
    assert node1[-5:] == ["1", "700", "0", "authorized_keys", node1[-1]]
    # PID namespace: the node sees only its own processes, its init is PID 1.
    assert lab.host("node1").process.get(pid=1).comm == "tini"
    # /proc/sys is the host's: read-only in nodes.
    assert (
        "Read-only"
        in subprocess.run(
            [
                sys.executable,
                "-m",
                "lab",
                "ssh",
                "node1",
                "--",
                "echo 1 > /proc/sys/kernel/domainname",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
        ).stderr
    )
    # Nodes reach each other, over the lab bridge only.
    assert (
        lab.ssh(
            "node1",
            "getent ahostsv4 198.18.0.12 >/dev/null && timeout 3 bash -c "
            "'</dev/tcp/198.18.0.12/22' && echo open",
        ).strip()
        == "open"
    )
    lab.down()
    assert traces() == []


def test_down_cleans_up_after_a_crash_that_lost_the_state_file(lab):
    lab.fresh(2)
    pids = [n.pid for n in Lab().nodes()]
    os.unlink(STATE_DIR / "state.json")  # as if the controller died mid-run

    down = cli("down")

    assert down.returncode == 0, down.stderr
    assert traces() == []
    assert_gone(pids)


def test_a_failed_up_tears_down_what_it_started(lab, monkeypatch):
    lab.down()
    real_boot = Lab._boot

    def boot_then_fail(self, node):
        if node.name == "node2":
            raise RuntimeError("injected failure while booting node2")
        return real_boot(self, node)

    monkeypatch.setattr(Lab, "_boot", boot_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        Lab().up(3, log=lambda *_: None)
    assert traces() == []
