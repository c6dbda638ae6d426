"""Drift's reading of one node, ``checks.drift_check.observe`` (what ``compare_fingerprints`` calls
for each node): the recorded lab node's fingerprint, as the benchmark's fleet rewrites it for a
converged 3-node cluster, read through the real facts. It holds exactly the expected properties,
and a changed fact changes exactly the properties read from it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from bench.controller import fleet as fleet_mod
from bench.controller.record import load
from checks.drift_check import expect, observe
from tests.unit.test_pure_plan import _fingerprints
from trainfleet.compare import digest

NODES = ("node0001", "node0002", "node0003")
# What the recorded lab node answered of itself (bench/controller/recorded.json): no operation of
# trainfleet writes these, so no plan says them.
RECORDED = {
    "os": "Debian GNU/Linux 12 (bookworm)",
    "kernel": "6.18.44-fc-v595",
    "gpus": "none",
    "gpu driver": "none",
    "cuda": "13.0",  # the lab's nvcc
    "torch": "absent",
    "gcc": "12.2.0",
    "openmpi": "absent",
    "pdsh": "installed, rcmd ssh",
    "cluster MTU": "1500",
    "ib ports active": "none",
    "ib active MTU": "none",
    "clock sync": "none",
    "clock offset": "not synchronised (no chrony or timesyncd active)",
    "memlock (non-login ssh)": "8192",  # the lab's hard limit, which its spec asks for
    "memlock set elsewhere": "none",
}
# The plan's verdicts and the values a converged node of the fleet's spec shows, spelled out.
NCCL_SEEN = (
    "GLOO_SOCKET_IFNAME=eth0 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME==eth0 UCX_NET_DEVICES=eth0"
)
CONVERGED = {
    "stale /etc/hosts lines": "none",
    "sshd mesh plan": "ok",
    "ssh mesh plan (root)": "ok",
    "ssh mesh (root)": "ok",
    "NCCL env (non-login ssh)": NCCL_SEEN,
    "NCCL env (login shell)": NCCL_SEEN,
    "GPU settings plan": "ok",
}
# Managed files and key material, observed as digests or summaries: the plan's (expect's) values.
DIGESTS = (
    "hosts block",
    "known_hosts block",
    "host certificates",
    "sshd mesh files",
    "ssh client drop-in",
    "user certificate (root)",
    "authorized_keys (root)",
    "ssh config (root)",
    "cluster key (root)",
    "pdsh nodes",
    "NCCL env files",
    "launcher files",
    "openmpi params (root)",
    "memlock file",
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> fleet_mod.Fleet:
    return fleet_mod.build(len(NODES), tmp_path_factory.mktemp("fleet"), load())


@pytest.fixture(scope="module")
def fingerprints(fleet) -> dict[str, Any]:
    return _fingerprints(fleet)


@pytest.mark.parametrize("name", NODES)
def test_a_converged_node_is_observed_as_planned_and_as_it_was_recorded(fleet, fingerprints, name):
    """Every property the plan expects is observed at its planned value; the others are what
    the recorded node said of itself, and the plan's verdicts. (The properties are the
    capabilities' own: no list here names them all, so a new one costs no edit.)"""
    fp, plan = fingerprints[name], fleet.plan.nodes[name]
    planned, seen = expect(plan), observe(fp, plan, fleet.cluster)
    assert {prop: seen.get(prop) for prop in planned} == planned
    assert {prop: seen.get(prop) for prop in [*RECORDED, *CONVERGED]} == {**RECORDED, **CONVERGED}
    assert set(DIGESTS) <= planned.keys()  # the managed files are among what is planned
    assert (seen["hostname"], seen["boot_id"]) == (name, fp["identity"]["boot_id"])


def _set(*path: str | int, to: Any) -> Callable[[dict[str, Any]], None]:
    """Set the fact at ``path`` (``to``: a value, or a function of the old one)."""

    def change(fp: dict[str, Any]) -> None:
        *parents, last = path
        for key in parents:
            fp = fp[key]
        fp[last] = to(fp[last]) if callable(to) else to

    return change


CHANGED = "(any other value)"  # a digest of what the change left
H100 = {"name": "NVIDIA H100 80GB HBM3", "driver": "550.54.15"}
# (the fact changed, how) -> the properties that change, and to what (a value, CHANGED, or a
# function of the value before)
CASES = {
    "kernel": (_set("identity", "kernel", to="6.1.0-18-amd64"), {"kernel": "6.1.0-18-amd64"}),
    "os": (_set("identity", "os", to="Ubuntu 22.04.4 LTS"), {"os": "Ubuntu 22.04.4 LTS"}),
    "boot": (_set("identity", "boot_id", to="b-2"), {"boot_id": "b-2"}),
    "gpus": (
        _set("identity", "gpus", to=[H100] * 8),
        {"gpus": "8x NVIDIA H100 80GB HBM3", "gpu driver": "550.54.15"},
    ),
    "running hostname": (_set("hostname", "running", to="imposter"), {"hostname": "imposter"}),
    "static hostname": (
        _set("hostname", "static", to=None),
        {"hostname (persistent)": "absent"},
    ),
    "hosts block": (
        _set("hosts", "block", to=lambda lines: lines[:-1]),
        {"hosts block": CHANGED},
    ),
    "stale hosts line": (
        _set("hosts", "outside", to=lambda lines: [*lines, (4, "203.0.113.7 node0002")]),
        {
            "stale /etc/hosts lines": "line 4 maps node0002 to 203.0.113.7, "
            "but the cluster says 198.18.0.2"
        },
    ),
    "known_hosts": (
        _set("known_hosts", "block", to=lambda lines: [*lines, "# edited"]),
        {"known_hosts block": CHANGED},
    ),
    "nvcc": (_set("stack", "nvcc", "release", to="12.4"), {"cuda": "12.4"}),
    "torch": (_set("stack", "torch", to={"version": "2.4.1+cu124"}), {"torch": "2.4.1+cu124"}),
    "gcc": (_set("stack", "gcc", "version", to="11.4.0"), {"gcc": "11.4.0"}),
    "venv package": (
        _set("stack", "venv_packages", to={"deepspeed": "0.14.4"}),
        {"python deepspeed": "0.14.4"},
    ),
    "held package": (
        _set("stack", "packages", to={"libnccl2": "2.21.5-1+cuda12.4"}),
        {"package libnccl2": "2.21.5-1+cuda12.4", "package libnccl2 hold": "not held"},
    ),
    "openmpi": (_set("openmpi", "version", to="4.1.4"), {"openmpi": "4.1.4"}),
    "openmpi params": (
        _set("openmpi", "users", "root", "params", "block", to=lambda lines: lines[:1]),
        {"openmpi params (root)": CHANGED},
    ),
    "pdsh rcmd": (_set("pdsh", "rcmd_default", to=None), {"pdsh": "installed, rcmd default"}),
    "genders": (_set("pdsh", "genders", "block", to=[]), {"pdsh nodes": digest([])}),
    "mesh proof": (
        _set("mesh_proof:root", "node0003", to="Permission denied (publickey)"),
        {"ssh mesh (root)": "fails: node0003 (Permission denied (publickey))"},
    ),
    "no mesh proof": (_set("mesh_proof:root", to={}), {"ssh mesh (root)": "not probed"}),
    "cluster key mode": (
        _set("mesh_user:root", "identity", "mode", to="644"),
        {"cluster key (root)": lambda was: f"{was.split()[0]} 644"},  # the same key, its mode
    ),
    "authorized_keys": (
        _set("mesh_user:root", "authorized", "block", to=[]),
        {"authorized_keys (root)": digest([])},
    ),
    "ssh config": (
        _set("mesh_user:root", "config", "block", to=[]),
        {"ssh config (root)": digest([])},
    ),
    "user certificate": (
        _set("mesh_user:root", "certificate", to=None),
        {"user certificate (root)": "absent"},
    ),
    "host certificate": (
        _set("sshd_mesh", "certificates", to={}),
        {"host certificates": "none"},
    ),
    "sshd drop-in": (
        _set("sshd_mesh", "drop_in", to=None),
        {"sshd mesh files": lambda was: "drop-in absent, " + was.split(", ")[1]},
    ),
    "ssh client drop-in": (
        _set("sshd_mesh", "client_drop_in", to=None),
        {"ssh client drop-in": "absent"},
    ),
    "nccl seen": (
        _set("nccl_seen", "non_login", to=lambda env: {**env, "NCCL_IB_DISABLE": "0"}),
        {"NCCL env (non-login ssh)": NCCL_SEEN.replace("DISABLE=1", "DISABLE=0")},
    ),
    "nccl login": (
        _set("nccl_seen", "login", to={}),
        {"NCCL env (login shell)": "none"},
    ),
    "nccl files": (_set("nccl_files", "profile", to=None), {"NCCL env files": CHANGED}),
    "launcher": (
        _set("launchers", "torchrun.sh", "sha256", to="0" * 64),
        {"launcher files": CHANGED},
    ),
    "memlock": (_set("gpu_node", "memlock", to="65536"), {"memlock (non-login ssh)": "65536"}),
    "memlock file": (_set("gpu_node", "memlock_conf", to=None), {"memlock file": "absent"}),
    "memlock elsewhere": (
        _set("gpu_node", "memlock_other", to=["/etc/security/limits.conf:60"]),
        {"memlock set elsewhere": "/etc/security/limits.conf:60"},
    ),
    "mtu": (
        _set("network", "interfaces", 2, "mtu", to=9000),  # eth0, the cluster interface
        {"cluster MTU": "9000"},
    ),
}


@pytest.mark.parametrize("fact", CASES)
def test_a_changed_fact_changes_exactly_the_property_read_from_it(fleet, fingerprints, fact):
    change, wanted = CASES[fact]
    name = NODES[0]
    fp, plan = fingerprints[name], fleet.plan.nodes[name]
    before = observe(fp, plan, fleet.cluster)
    changed = copy.deepcopy(fp)
    change(changed)
    after = observe(changed, plan, fleet.cluster)
    differs = {
        prop: after.get(prop, "(gone)")
        for prop in {*before, *after}
        if before.get(prop) != after.get(prop)
    }

    def want(prop: str, value: Any) -> str | None:
        if callable(value):
            return value(before[prop])
        return differs.get(prop) if value == CHANGED else value  # CHANGED: it must differ

    assert differs == {prop: want(prop, value) for prop, value in wanted.items()}
