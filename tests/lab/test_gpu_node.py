"""GPU node settings on the lab (no GPUs, no systemd, no nvidia-smi): only memlock applies. The
deploy writes the limits.d file, a second run changes nothing, a non-login ssh session gets the
limit through pam_limits, drift is clean; a hand-edited file is named by node.

pam_limits can raise a hard limit only with CAP_SYS_RESOURCE, which a container (this lab's host
in CI) may lack: the spec then asks for half the host's hard limit, which pam_limits can always
set, so the test proves the file reaches the session wherever it runs. With the capability it
asks for ``unlimited``, the default.
"""

from __future__ import annotations

import json
import resource
from types import SimpleNamespace

import pytest

from checks.drift_check import report_path
from facts.gpu_node_facts import MEMLOCK_CONF, PEERMEM_CONF
from tests.lab.harness import deploy_twice, pyinfra
from trainfleet.capabilities.gpu_node import memlock_conf

CLUSTER = "deploy/cluster.py"
DRIFT = "deploy/drift.py"
NODES = ["node1", "node2", "node3"]
OP = "GPU node settings (memlock, persistence, fabric manager, nvidia_peermem)"


_, HARD = resource.getrlimit(resource.RLIMIT_MEMLOCK)
MEMLOCK = "unlimited" if HARD == resource.RLIM_INFINITY else str(max(64, HARD // 1024 // 2))  # KiB


@pytest.fixture(scope="module")
def converged(lab, tmp_path_factory):
    lab.fresh(3)
    inventory = lab.spec_inventory(
        tmp_path_factory.mktemp("gpu_node"),
        gpu={"memlock": MEMLOCK if MEMLOCK == "unlimited" else int(MEMLOCK)},
    )
    first, second = deploy_twice(inventory, CLUSTER)
    return SimpleNamespace(lab=lab, inventory=inventory, first=first, second=second)


def drift_run(inventory: str):
    run = pyinfra(inventory, DRIFT)
    return run, json.loads(report_path("lab").read_text())


def test_the_memlock_file_is_written_once_and_a_non_login_ssh_session_gets_unlimited(converged):
    lab = converged.lab
    assert sorted(converged.first.changed()[OP]) == NODES
    assert OP not in converged.second.changed()  # deploy_twice: the re-run changed nothing at all
    for node in NODES:
        conf = lab.host(node).file(MEMLOCK_CONF)
        assert conf.content_string == memlock_conf(MEMLOCK), node
        assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o644), node
        # what ranks started over ssh (pdsh, mpirun, DeepSpeed's runner) get: a non-login session
        assert lab.ssh(node, "ulimit -l; ulimit -H -l").split() == [MEMLOCK, MEMLOCK], node


def test_drift_is_clean_and_reads_memlock_as_the_session_sees_it(converged):
    run, report = drift_run(converged.inventory)
    assert run.returncode == 0 and report["drift"] is False, report["findings"]
    for node in NODES:
        props = report["nodes"][node]["properties"]
        assert props["memlock (non-login ssh)"] == MEMLOCK
        assert props["clock sync"] == "none" and props["cluster MTU"] == "1500"
        assert (
            "persistence mode" not in props
        )  # no nvidia-smi on a lab node: no GPU property to compare


def test_a_hand_lowered_memlock_is_named_on_its_node_then_converged_again(converged):
    lab = converged.lab
    lab.ssh("node2", f"sed -i 's/ {MEMLOCK}$/ 64/' {MEMLOCK_CONF}")
    assert lab.ssh("node2", "ulimit -l").strip() == "64"  # a new session gets the lowered limit
    run, report = drift_run(converged.inventory)
    assert run.returncode != 0
    found = {(f["node"], f["property"]): f for f in report["findings"]}
    assert set(found) == {("node2", "memlock (non-login ssh)"), ("node2", "memlock file")}, report[
        "findings"
    ]
    assert (
        found[("node2", "memlock (non-login ssh)")]["observed"],
        found[("node2", "memlock (non-login ssh)")]["expected"],
    ) == ("64", MEMLOCK)
    # #40: trainfleet's nvidia_peermem boot file, as the old rule wrote it, where gpu.peermem
    # auto no longer wants it (no GPU here; on a GPU node: DMA-BUF): the same re-deploy removes
    # it, and its second run changes nothing
    lab.ssh("node2", f"mkdir -p /etc/modules-load.d && printf 'nvidia_peermem\\n' > {PEERMEM_CONF}")
    first, _ = deploy_twice(converged.inventory, CLUSTER)
    assert first.changed()[OP] == ["node2"]
    assert not lab.host("node2").file(PEERMEM_CONF).exists
    run, report = drift_run(converged.inventory)
    assert run.returncode == 0 and not report["drift"], report["findings"]
    assert report["nodes"]["node2"]["properties"]["nvidia_peermem file"] == "absent"
