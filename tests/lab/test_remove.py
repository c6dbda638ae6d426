"""``trainfleet remove SPEC`` on real nodes adopted with their own hostnames
(``manage: {hostname: false}``): after two deploys, no trainfleet block, file, unit or hold is
left, every byte the user had before the first deploy is as it was (the hostname too), a second
remove changes nothing, and drift says the nodes are not managed (#43)."""

from __future__ import annotations

import base64
import shlex
from types import SimpleNamespace

import pytest

from facts.remove_facts import BLOCK_FILES, HOME_BLOCK_FILES, OWNED_FILES
from tests.lab.harness import adopted_spec, front_door, pyinfra
from trainfleet.defaults import LAUNCH_DIR, MESH_KEY_NAME

NODES = ("node1", "node2", "node3")
FROM_SPEC = "inventories/from_spec.py"  # the front door's inventory: the spec names the nodes
# The user's own lines, placed before the first deploy (each file's last line ends in a newline:
# a deploy that appends its block after a last line without one adds that newline, for good).
USER_LINES = {
    "/etc/hosts": "192.0.2.7 fileserver # the user's own entry\n",
    "/etc/environment": 'HTTP_PROXY="http://proxy.example:3128"\n',
    "/root/.ssh/authorized_keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUser user@laptop\n",
    "/root/.ssh/config": "Host github.com\n    User git\n",
}
SNAPSHOT = sorted(
    {
        "/etc/hostname",  # the node's own: the spec leaves it alone (manage: {hostname: false})
        *USER_LINES,
        *(f.path for f in BLOCK_FILES),
        *(f"/root/{f.path}" for f in HOME_BLOCK_FILES),
    }
)
# (the lab's own files are named trainfleet-lab: the node image's, not the product's)
# Every path of trainfleet's own that must be gone: its whole files, launchers and mesh key.
GONE = [
    *(f.path for f in OWNED_FILES),
    LAUNCH_DIR,
    *(f"/root/.ssh/{MESH_KEY_NAME}{end}" for end in ("", ".pub", "-cert.pub")),
]
NOT_MANAGED = "trainfleet is 'not managed', the spec wants 'managed'"
# What is left of trainfleet on a node: blocks, files by name, its own paths, holds.
TRACES = (
    "grep -rlsF 'trainfleet managed block' /etc /root || true; "
    "find /etc /root /opt -name '*trainfleet*' ! -name '*trainfleet-lab*' 2>/dev/null || true; "
    + "".join(f"[ ! -e {path} ] || echo {path}; " for path in GONE)
    + "apt-mark showhold 2>/dev/null || true"
)


def snapshot(lab, node: str) -> dict[str, bytes | None]:
    """The SNAPSHOT files' exact bytes on ``node`` (None: no such file) and its running
    hostname, in one login."""
    script = 'for f in "$@"; do [ -f "$f" ] && echo "$f =$(base64 -w0 < "$f")" || echo "$f -"; done'
    out = lab.ssh(node, f"hostname; sh -c {shlex.quote(script)} sh {' '.join(SNAPSHOT)}")
    running, *lines = out.splitlines()
    found = dict(line.split(" ") for line in lines)
    files = {p: None if found[p] == "-" else base64.b64decode(found[p][1:]) for p in SNAPSHOT}
    return {"hostname": running.encode(), **files}


@pytest.fixture(scope="module")
def removed(lab, tmp_path_factory):
    """A fresh lab, each node with its own hostname and the user's lines, adopted keeping its
    hostnames (``manage: {hostname: false}``), deployed twice, then removed."""
    lab.fresh(3)
    for node in NODES:
        for path, lines in USER_LINES.items():
            lab.ssh(node, f"cat >> {path}", input=lines)
    before = {node: snapshot(lab, node) for node in NODES}
    adopted = adopted_spec(lab.lab.spec, tmp_path_factory.mktemp("remove"))
    env = {"TRAINFLEET_SPEC": str(adopted)}
    deployed = pyinfra(FROM_SPEC, "deploy/cluster.py", env=env)
    assert deployed.returncode == 0, deployed.describe()
    again = pyinfra(FROM_SPEC, "deploy/cluster.py", env=env)
    assert again.returncode == 0 and again.changed() == {}, again.describe()
    converged = snapshot(lab, "node1")
    dry = front_door("remove", str(adopted), "--dry")
    after_dry = snapshot(lab, "node1")
    remove = front_door("remove", str(adopted), "-y")
    return SimpleNamespace(
        lab=lab,
        spec=adopted,
        env=env,
        before=before,
        deployed=deployed,
        remove=remove,
        dry=(dry, converged, after_dry),
    )


def test_a_dry_remove_changes_nothing(removed):
    dry, converged, after = removed.dry
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert after == converged != removed.before["node1"]


def test_remove_leaves_every_user_byte_and_no_trainfleet_block_file_or_unit(removed):
    lab, remove = removed.lab, removed.remove
    assert remove.returncode == 0, remove.stderr[-3000:]
    assert "the hostname trainfleet set stays" not in remove.stderr  # it never set one
    # the deploy had written into the user's files (else the bytes below prove nothing)
    for step in ("Cluster hosts block in /etc/hosts", "SSH mesh for root"):
        assert sorted(removed.deployed.changed()[step]) == list(NODES)
    for node in NODES:
        assert snapshot(lab, node) == removed.before[node], f"{node}: user bytes changed"
        assert lab.ssh(node, TRACES).split() == [], f"{node}: trainfleet left these"


def test_a_second_remove_changes_nothing(removed):
    again = pyinfra(FROM_SPEC, "deploy/remove.py", env=removed.env)
    assert again.returncode == 0, again.describe()
    assert again.changed() == {}, again.changed()
    assert again.operations, "the second remove reported no operations at all"


def test_drift_says_not_managed_after_remove(removed):
    drift = front_door("drift", str(removed.spec))
    assert drift.returncode == 1, drift.stdout + drift.stderr
    for node in NODES:  # one finding each, not a list of missing blocks and files
        said = [line for line in drift.stderr.splitlines() if f"[{node}] trainfleet: drift" in line]
        assert said == [f"    [{node}] trainfleet: drift: {NOT_MANAGED}"], drift.stderr[-6000:]
