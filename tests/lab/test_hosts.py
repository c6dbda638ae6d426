"""Hostnames and /etc/hosts on real nodes over real SSH, each deploy run twice."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.lab.harness import LAB_INVENTORY, deploy_twice, pyinfra, readmit

DEPLOY = "deploy/cluster.py"
BEGIN = "# BEGIN trainfleet managed block: cluster hosts (do not edit)"
END = "# END trainfleet managed block: cluster hosts"
NODES = {"node1": "198.18.0.11", "node2": "198.18.0.12", "node3": "198.18.0.13"}
USER_LINES = "192.0.2.7 fileserver # the user's own entry\n198.18.0.99 node3\n"


def expected_block(nodes: dict[str, str]) -> list[str]:
    return [f"{addr:<15} {name}.lab.trainfleet.test {name}" for name, addr in nodes.items()]


def resolved(host, name: str) -> str:
    """The first address the node's resolver gives for ``name`` (what a rank connects to)."""
    return host.check_output("getent hosts %s", name).split()[0]


def split(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    start, stop = lines.index(BEGIN), lines.index(END)
    return lines[start + 1 : stop], lines[:start] + lines[stop + 1 :]


@pytest.fixture(scope="module")
def named(lab):
    """One fresh lab for this module with a user's lines seeded on node2, converged twice."""
    lab.fresh(3)
    lab.ssh("node2", "cat >> /etc/hosts", input=USER_LINES)
    before = {node: lab.host(node).file("/etc/hosts").content_string for node in NODES}
    initial_name = lab.host("node1").check_output("hostname")
    first, _ = deploy_twice(LAB_INVENTORY, DEPLOY)
    return SimpleNamespace(lab=lab, before=before, initial_name=initial_name, first=first)


def test_every_node_gets_its_name_and_every_peer_and_a_rerun_changes_nothing(named):
    lab3, before, first = named.lab, named.before, named.first
    assert named.initial_name == "ip-198-18-0-11"

    assert sorted(first.changed()["Hostname is the node's spec name"]) == sorted(NODES)
    assert sorted(first.changed()["Cluster hosts block in /etc/hosts"]) == sorted(NODES)
    for node in NODES:
        host = lab3.host(node)
        assert host.check_output("hostname") == node
        assert host.file("/etc/hostname").content_string == f"{node}\n"
        block, outside = split(host.file("/etc/hosts").content_string)
        assert block == expected_block(NODES)
        assert outside == before[node].splitlines(), f"{node}: lines outside the block changed"
        # The resolver now answers with the cluster's addresses, by short name and FQDN.
        assert resolved(host, "node3") == "198.18.0.13" or node == "node2"
        assert resolved(host, "node1.lab.trainfleet.test") == "198.18.0.11"
    # node2's stale line comes before the block and shadows it: reported, not silently kept.
    assert (
        "[node2]" in first.stderr
        and "maps node3 to 198.18.0.99, but the cluster says 198.18.0.13" in first.stderr
    )
    assert resolved(lab3.host("node2"), "node3") == "198.18.0.99"


def test_a_node_removed_from_the_spec_is_removed_from_every_block(named, tmp_path):
    lab3 = named.lab
    two_nodes = lab3.spec_inventory(tmp_path, keep=["node1", "node2"])

    first, _ = deploy_twice(two_nodes, DEPLOY)

    assert sorted(first.changed()["Cluster hosts block in /etc/hosts"]) == ["node1", "node2"]
    for node in ("node1", "node2"):
        block, _ = split(lab3.host(node).file("/etc/hosts").content_string)
        assert block == expected_block({"node1": NODES["node1"], "node2": NODES["node2"]})
    readmit(lab3, "node3")  # its host keys were revoked when it left the spec
    deploy_twice(LAB_INVENTORY, DEPLOY)  # back to the whole cluster


def test_damaged_markers_fail_that_node_only_and_leave_its_file_alone(named):
    lab3 = named.lab
    hosts_file = lab3.host("node3").file("/etc/hosts")
    healthy = hosts_file.content_string
    broken = healthy.replace(END + "\n", "")
    lab3.ssh("node3", "cat > /etc/hosts", input=broken)

    run = pyinfra(LAB_INVENTORY, DEPLOY)

    assert run.returncode != 0, run.describe()
    # node3 fails at its hosts block (pyinfra then skips its later operations); no one else fails.
    assert run.errors()["Cluster hosts block in /etc/hosts"] == ["node3"]
    assert {host for hosts in run.errors().values() for host in hosts} == {"node3"}
    assert "expected one BEGIN followed by one END marker" in run.stderr and "[node3]" in run.stderr
    assert hosts_file.content_string == broken
    for node in ("node1", "node2"):
        block, _ = split(lab3.host(node).file("/etc/hosts").content_string)
        assert block == expected_block(NODES)
    lab3.ssh("node3", "cat > /etc/hosts", input=healthy)  # the user mends the markers
    deploy_twice(LAB_INVENTORY, DEPLOY)


def test_a_dry_run_on_a_converged_cluster_plans_no_change(named):
    run = pyinfra(LAB_INVENTORY, DEPLOY, dry=True)
    assert run.returncode == 0, run.describe()
    assert run.report["plan"], "the dry run planned no operations at all"
    assert run.planned_changes() == {}


def test_a_dry_run_plans_the_change_a_hand_edit_needs_and_makes_none(named):
    lab3 = named.lab
    hosts_file = lab3.host("node2").file("/etc/hosts")
    before = hosts_file.sha256sum
    lab3.ssh("node2", "sed -i 's/^198.18.0.13 /198.18.0.99 /' /etc/hosts")
    edited = hosts_file.sha256sum
    assert edited != before
    run = pyinfra(LAB_INVENTORY, DEPLOY, dry=True)
    assert run.returncode == 0, run.describe()
    changes = run.planned_changes()
    assert list(changes.values()) == [["node2"]], changes  # the hosts block of node2, nothing else
    assert hosts_file.sha256sum == edited  # a dry run changes nothing
    deploy_twice(LAB_INVENTORY, DEPLOY)
    assert hosts_file.sha256sum == before
