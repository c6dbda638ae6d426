"""Hostnames and /etc/hosts on real nodes over real SSH, each deploy run twice. The module's
lab is first adopted as a running cluster is (docs/adopt.md): drift before any deploy, then the
front door's deploy with ``manage: {hostname: false}``; then the whole spec renames the nodes."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from facts.hosts_facts import HOSTS_PURPOSE
from tests.lab.harness import (
    LAB_INVENTORY,
    adopted_spec,
    deploy_twice,
    front_door,
    on_every_node,
    pyinfra,
    readmit,
)
from trainfleet.blocks import markers, split_block
from trainfleet.nccl import ENV_PURPOSE

DEPLOY = "deploy/cluster.py"
_, END = markers(HOSTS_PURPOSE)
NODES = {"node1": "198.18.0.11", "node2": "198.18.0.12", "node3": "198.18.0.13"}
USER_LINES = "192.0.2.7 fileserver # the user's own entry\n198.18.0.99 node3\n"
USER_ENVIRONMENT = 'TEAM_DATA="/data/team"  # the user\'s own line\n'
ADOPTED = ("/etc/hostname", "/etc/hosts", "/etc/environment")
BLOCKS = {"/etc/hosts": HOSTS_PURPOSE, "/etc/environment": ENV_PURPOSE}  # file -> its block
# pyinfra's results table: an operation's name, then its hosts, successes (changes), errors and
# no-change counts ("-" for none)
RESULT_ROW = re.compile(r" {4}(.+?) +([0-9]+) +([0-9]+|-) +([0-9]+|-) +([0-9]+|-) *")


def changed_by(run: subprocess.CompletedProcess[str]) -> dict[str, int]:
    """Operation name -> the nodes it changed, from pyinfra's results table (the front door
    prints pyinfra's own output); a run without that table fails here."""
    table = run.stderr.split("--> Results:", 1)
    assert len(table) == 2, run.stderr[-3000:]
    rows = [RESULT_ROW.fullmatch(line) for line in table[1].splitlines()]
    found = {m.group(1): m.group(3) for m in rows if m and m.group(1) != "Grand total"}
    assert found, table[1]
    return {name: int(count) for name, count in found.items() if count != "-"}


def held(lab, resolve: tuple[str, ...] = ()) -> dict[str, dict[str, str]]:
    """Each node's running hostname and the files adopting it may touch, and the first address
    its resolver gives for each name in ``resolve`` (what a rank connects to): one login per
    node, all at once."""
    files = " ".join(ADOPTED)
    lookups = "".join(f"; printf '\\0'; getent hosts {name} | head -n 1" for name in resolve)
    command = f"hostname; for f in {files}; do printf '\\0'; cat $f; done{lookups}"
    return {
        node: _held(out, resolve) for node, out in on_every_node(lab, [*NODES], command).items()
    }


def _held(out: str, resolve: tuple[str, ...]) -> dict[str, str]:
    name, *rest = out.split("\0")
    found = dict(zip(ADOPTED, rest, strict=False))
    found |= {n: line.split()[0] for n, line in zip(resolve, rest[len(ADOPTED) :], strict=True)}
    return {"hostname": name.strip(), **found}


def adopt(lab, tmp_path: Path) -> SimpleNamespace:
    """The lab as a running cluster: its own hostnames, a user's lines in /etc/hosts and
    /etc/environment; drift before any deploy, the adopting deploy twice, drift after."""
    spec_file = adopted_spec(lab.lab.spec, tmp_path)
    drift_before = front_door("drift", str(spec_file))
    untouched = held(lab)  # the first contact wrote nothing
    first = front_door("deploy", str(spec_file), "-y")
    second = front_door("deploy", str(spec_file), "-y")
    drift_after = front_door("drift", str(spec_file))
    return SimpleNamespace(
        before=drift_before,
        untouched=untouched,
        first=first,
        second=second,
        after=drift_after,
        spec=spec_file,
    )


def expected_block(nodes: dict[str, str]) -> list[str]:
    return [f"{addr:<15} {name}.lab.trainfleet.test {name}" for name, addr in nodes.items()]


def split(text: str) -> tuple[list[str] | None, list[str]]:
    """/etc/hosts as the deploy parses it: the cluster's block and the user's lines."""
    hosts = split_block(text, HOSTS_PURPOSE)
    return hosts.block, [line for _, line in hosts.outside]


@pytest.fixture(scope="module")
def named(lab, tmp_path_factory):
    """One fresh lab for this module with a user's lines seeded on node2 and every node's
    /etc/environment, adopted with its own hostnames (``adopt``), then converged twice."""
    lab.fresh(3)
    lab.ssh("node2", "cat >> /etc/hosts", input=USER_LINES)
    on_every_node(lab, [*NODES], f"printf %s {shlex.quote(USER_ENVIRONMENT)} >> /etc/environment")
    own = held(lab)
    adopted = adopt(lab, tmp_path_factory.mktemp("adopt"))
    kept = held(lab)
    first, _ = deploy_twice(LAB_INVENTORY, DEPLOY)
    return SimpleNamespace(
        lab=lab,
        before={node: own[node]["/etc/hosts"] for node in NODES},
        own=own,
        kept=kept,
        initial_name=own["node1"]["hostname"],
        adopted=adopted,
        first=first,
    )


def user_lines(text: str | None, purpose: str) -> list[str]:
    """A file's lines outside trainfleet's block for ``purpose`` (the user's)."""
    return [line for _, line in split_block(text or "", purpose).outside]


def test_drift_before_the_first_deploy_says_per_step_and_node_what_it_would_change(named):
    run = named.adopted.before
    assert run.returncode == 1, run.stderr[-3000:]  # findings: nothing deployed yet
    report = json.loads(run.stdout[run.stdout.index("{") :])
    changes = report["would_change"]
    assert report["not_managed"] == ["hostname"]
    # every managed step the lab's spec has, on every node; the hostname is kept: no line
    assert {"hosts", "ssh_mesh", "pdsh", "nccl_env", "openmpi", "launchers"} <= set(changes)
    assert "hostname" not in changes and all(set(on) == set(NODES) for on in changes.values())
    assert changes["hosts"]["node2"] == ["hosts block (/etc/hosts) would be added"]
    assert "not managed (the spec's manage:): hostname" in run.stderr
    assert "  hosts: node[1-3]: hosts block (/etc/hosts) would be added" in run.stderr
    assert "  pdsh: node[1-3]: pdsh nodes (/etc/genders) would be added" in run.stderr
    # the hostname is observed (unique), never expected: no node is asked to be renamed
    assert not any(f["property"].startswith("hostname") for f in report["findings"])
    assert named.adopted.untouched == named.own  # read-only: every byte and name as it was


def test_the_adopting_deploy_keeps_each_hostname_converges_and_a_rerun_changes_nothing(named):
    adopted = named.adopted
    assert adopted.first.returncode == 0, adopted.first.stderr[-3000:]
    assert adopted.second.returncode == 0, adopted.second.stderr[-3000:]
    changed = changed_by(adopted.first)
    assert changed["Cluster hosts block in /etc/hosts"] == len(NODES)
    assert not any(name.startswith("Hostname") for name in changed)
    assert changed_by(adopted.second) == {}, adopted.second.stderr[-3000:]
    assert named.own["node1"]["hostname"] == "ip-198-18-0-11"
    for node in NODES:
        own, kept = named.own[node], named.kept[node]
        assert kept["hostname"] == own["hostname"] and kept["/etc/hostname"] == own["/etc/hostname"]
        for path, purpose in BLOCKS.items():  # the user's bytes, each kept
            assert user_lines(kept[path], purpose) == user_lines(own[path], purpose), (
                f"{node}: {path}"
            )
        assert USER_ENVIRONMENT.strip() in kept["/etc/environment"].splitlines()
        assert kept["/etc/hosts"] != own["/etc/hosts"]  # the cluster's block was added
    drift = adopted.after
    report = json.loads(drift.stdout[drift.stdout.index("{") :])
    # converged: node2's own line that maps node3 elsewhere is the one finding left (the job's
    # concern, expected whatever is managed); nothing a deploy would change
    assert [(f["node"], f["property"]) for f in report["findings"]] == [
        ("node2", "stale /etc/hosts lines")
    ], drift.stderr[-3000:]
    assert "would_change" not in report and report["not_managed"] == ["hostname"]
    assert "not managed (the spec's manage:): hostname" in drift.stderr


def test_every_node_gets_its_name_and_every_peer_and_a_rerun_changes_nothing(named):
    lab3, before, first = named.lab, named.before, named.first
    assert named.initial_name == "ip-198-18-0-11"

    # the adopting deploy wrote the block; this one, the whole spec, renames every node
    assert sorted(first.changed()) == ["Hostname is the node's spec name"], first.changed()
    assert sorted(first.changed()["Hostname is the node's spec name"]) == sorted(NODES)
    every = held(lab3, resolve=("node3", "node1.lab.trainfleet.test"))
    for node, seen in every.items():
        assert seen["hostname"] == node
        assert seen["/etc/hostname"] == f"{node}\n"
        block, outside = split(seen["/etc/hosts"])
        assert block == expected_block(NODES)
        assert outside == before[node].splitlines(), f"{node}: lines outside the block changed"
        # The resolver now answers with the cluster's addresses, by short name and FQDN.
        assert seen["node3"] == ("198.18.0.99" if node == "node2" else "198.18.0.13")
        assert seen["node1.lab.trainfleet.test"] == "198.18.0.11"
    # node2's stale line comes before the block and shadows it (above): reported, not silently
    # kept.
    assert (
        "[node2]" in first.stderr
        and "maps node3 to 198.18.0.99, but the cluster says 198.18.0.13" in first.stderr
    )


def test_a_node_removed_from_the_spec_is_removed_from_every_block(named, tmp_path):
    lab3 = named.lab
    two_nodes = lab3.spec_inventory(tmp_path, keep=["node1", "node2"])

    first, _ = deploy_twice(two_nodes, DEPLOY)

    assert sorted(first.changed()["Cluster hosts block in /etc/hosts"]) == ["node1", "node2"]
    for node in ("node1", "node2"):
        block, _ = split(lab3.ssh(node, "cat /etc/hosts"))
        assert block == expected_block({"node1": NODES["node1"], "node2": NODES["node2"]})
    readmit(lab3, "node3")  # its host keys were revoked when it left the spec
    deploy_twice(LAB_INVENTORY, DEPLOY)  # back to the whole cluster


def test_damaged_markers_fail_that_node_only_and_leave_its_file_alone(named):
    lab3 = named.lab
    healthy = lab3.ssh("node3", "cat /etc/hosts")
    broken = healthy.replace(END + "\n", "")
    lab3.ssh("node3", "cat > /etc/hosts", input=broken)

    run = pyinfra(LAB_INVENTORY, DEPLOY)

    assert run.returncode != 0, run.describe()
    # node3 fails at its hosts block (pyinfra then skips its later operations); no one else fails.
    assert run.errors()["Cluster hosts block in /etc/hosts"] == ["node3"]
    assert {host for hosts in run.errors().values() for host in hosts} == {"node3"}
    assert "expected one BEGIN followed by one END marker" in run.stderr and "[node3]" in run.stderr
    assert lab3.ssh("node3", "cat /etc/hosts") == broken
    for node in ("node1", "node2"):
        block, _ = split(lab3.ssh(node, "cat /etc/hosts"))
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
    before = lab3.ssh("node2", "cat /etc/hosts")
    edited = lab3.ssh("node2", "sed -i 's/^198.18.0.13 /198.18.0.99 /' /etc/hosts; cat /etc/hosts")
    assert edited != before
    run = pyinfra(LAB_INVENTORY, DEPLOY, dry=True)
    assert run.returncode == 0, run.describe()
    changes = run.planned_changes()
    assert list(changes.values()) == [["node2"]], changes  # the hosts block of node2, nothing else
    assert lab3.ssh("node2", "cat /etc/hosts") == edited  # a dry run changes nothing
    deploy_twice(LAB_INVENTORY, DEPLOY)
    assert lab3.ssh("node2", "cat /etc/hosts") == before
