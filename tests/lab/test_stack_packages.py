"""The pinned stack's package branch with real apt and dpkg on Debian 12 nodes: NVIDIA's
repository (a local stand-in, see tests/lab/nvidia_repo.py: NVIDIA's package names and
version strings, and newer versions beside the pinned ones), exact versions (the NVIDIA
driver's branch meta-package at an exact release included), holds that
survive `apt-get upgrade`, a released hold named by drift and held again, a node moved off
its pin refused; and gcc-11 installed beside
Debian's default gcc 12 (from the host's apt cache) and selected with update-alternatives.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from checks.drift_check import report_path
from tests.lab import nvidia_repo
from tests.lab.harness import deploy_twice, fact, pyinfra

DEPLOY = "deploy/cluster.py"
DRIFT = "deploy/drift.py"
NODES = ["node1", "node2", "node3"]
MIRROR = "/srv/nvidia-mirror"  # on every node, as a site mirror of NVIDIA's repos would be
STACK = {
    "cuda": "12.4",
    "cudnn": "9.1.0.70",
    "nccl": "2.21.5-1",
    "gcc": "11",
    "cuda_repo": f"file://{MIRROR}",
    "driver": "550.54.15",
}
# The driver is planned for GPU nodes only: the nodes declare one GPU each, with the GPU
# settings that need a GPU and systemd (persistence, fabric manager, peermem) left unmanaged.
AS_GPU_NODES = {node: {"gpus": 1} for node in NODES}
GPU = {"persistence": False, "fabric_manager": "off", "peermem": "off"}
OP = "Pinned software stack (CUDA, cuDNN, NCCL, OpenMPI, GCC, PyTorch)"
VERSIONS = (
    "dpkg-query -W -f='${Package} ${Version}\\n' libnccl2 libnccl-dev libcudnn9-cuda-12 "
    "cuda-toolkit-12-4 cuda-drivers-550"
)
PINNED = {
    "libnccl2": "2.21.5-1+cuda12.4",
    "libnccl-dev": "2.21.5-1+cuda12.4",
    "libcudnn9-cuda-12": "9.1.0.70-1",
    # `cuda: 12.4` pins the series: the newest 12.4 package the repository has, then held
    "cuda-toolkit-12-4": nvidia_repo.NEWER["cuda-toolkit-12-4"],
    # an exact driver pin: that release, not the branch's newest
    "cuda-drivers-550": "550.54.15-1",
}


def versions(lab, node: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in lab.ssh(node, VERSIONS).splitlines())


@pytest.fixture(scope="module")
def pinned(lab, tmp_path_factory):
    lab.fresh(3)
    work = tmp_path_factory.mktemp("nvidia")
    fingerprint = nvidia_repo.build(work / "mirror")
    for node in NODES:
        lab.copy_tree(node, work / "mirror", MIRROR)
    # The keyring .deb is checked before dpkg -i: against the lab key's fingerprint, not NVIDIA's.
    inventory = lab.spec_inventory(
        work,
        node_settings=AS_GPU_NODES,
        gpu=GPU,
        stack={**STACK, "cuda_keyring_fingerprint": fingerprint},
    )
    first, _ = deploy_twice(inventory, DEPLOY)
    return SimpleNamespace(
        lab=lab, inventory=inventory, first=first, work=work, fingerprint=fingerprint
    )


def test_every_node_has_exactly_the_pinned_versions_not_the_newest(pinned):
    lab = pinned.lab
    assert sorted(pinned.first.changed()[OP]) == NODES
    for node in NODES:
        assert versions(lab, node) == PINNED, node
    # The repository offered newer ones: apt's candidate is not what got installed.
    policy = lab.ssh("node1", "apt-cache policy libnccl2")
    assert f"Candidate: {nvidia_repo.NEWER['libnccl2']}" in policy
    assert (
        lab.host("node1").file("/etc/apt/sources.list.d/cuda-debian12-x86_64.list").content_string
        == f"deb [signed-by={nvidia_repo.KEYRING}] file://{MIRROR}/debian12/x86_64/ /\n"
    )


def test_the_pins_are_held_and_survive_apt_get_upgrade(pinned):
    lab = pinned.lab
    for node in NODES:
        assert sorted(lab.ssh(node, "apt-mark showhold").split()) == sorted(PINNED), node
    # Offline nodes cannot fetch Debian's own updates, so the upgrade is run against the CUDA
    # repository alone, which holds the newer versions of every pinned package.
    upgrade = lab.ssh(
        "node2",
        "DEBIAN_FRONTEND=noninteractive apt-get upgrade -y "
        "-o Dir::Etc::SourceList=/etc/apt/sources.list.d/cuda-debian12-x86_64.list "
        "-o Dir::Etc::SourceParts=/nonexistent 2>&1",
        timeout=120,
    )
    kept = upgrade.split("kept back:", 1)[1].split("\n0 upgraded")[0].split()
    older = sorted(name for name, version in PINNED.items() if version != nvidia_repo.NEWER[name])
    assert sorted(kept) == older, upgrade  # apt saw the newer versions and kept the held ones back
    assert versions(lab, "node2") == PINNED
    facts = fact(pinned.inventory, "facts.stack_facts.StackVersions", "venv=/opt/trainfleet/venv")
    assert facts["node2"]["packages"]["libnccl2"] == PINNED["libnccl2"]
    assert set(facts["node2"]["held"]) == set(PINNED)


def drift_findings(inventory: str) -> set[tuple[str, str, str]]:
    pyinfra(inventory, DRIFT)
    report = json.loads(report_path("lab").read_text())
    return {(f["node"], f["property"], f["observed"]) for f in report["findings"]}


def test_a_released_hold_is_named_by_drift_and_held_again_by_the_deploy(pinned):
    lab = pinned.lab
    # GPU nodes without a GPU or a clock service: drift has findings of its own here (the
    # driver nvidia-smi cannot report, the clock); the hold is judged against them.
    converged = drift_findings(pinned.inventory)
    assert not [f for f in converged if f[1].endswith(" hold")], converged
    lab.ssh("node1", "apt-mark unhold libnccl2 >/dev/null")
    released = drift_findings(pinned.inventory)
    assert released == converged | {("node1", "package libnccl2 hold", "not held")}
    first, _ = deploy_twice(pinned.inventory, DEPLOY)  # the second run changes nothing
    assert first.changed()[OP] == ["node1"]
    assert sorted(lab.ssh("node1", "apt-mark showhold").split()) == sorted(PINNED)
    assert drift_findings(pinned.inventory) == converged


def test_gcc_11_is_selected_beside_the_default_12(pinned):
    lab = pinned.lab
    for node in NODES:
        assert lab.ssh(node, "gcc -dumpversion; g++ -dumpversion; gcc-12 -dumpversion").split() == [
            "11",
            "11",
            "12",
        ]
        gcc = lab.host(node).file("/usr/bin/gcc")
        assert gcc.linked_to == "/usr/bin/x86_64-linux-gnu-gcc-11"


def test_a_node_moved_off_its_pin_is_refused_unchanged_then_moved_back_when_allowed(
    pinned, tmp_path
):
    lab = pinned.lab
    newer = nvidia_repo.NEWER
    lab.ssh(
        "node3",
        "apt-mark unhold libnccl2 libnccl-dev >/dev/null && DEBIAN_FRONTEND=noninteractive "
        f"apt-get install -y -q libnccl2={newer['libnccl2']} libnccl-dev={newer['libnccl-dev']} "
        ">/dev/null",
    )

    refused = pyinfra(pinned.inventory, DEPLOY)

    assert refused.returncode != 0
    assert refused.errors()[OP] == ["node3"]
    assert (
        f"libnccl2 is {newer['libnccl2']} here, the pin is {PINNED['libnccl2']}" in refused.stderr
    )
    assert versions(lab, "node3")["libnccl2"] == newer["libnccl2"]  # nothing changed on it

    allowed = lab.spec_inventory(
        tmp_path,
        node_settings=AS_GPU_NODES,
        gpu=GPU,
        stack={**STACK, "cuda_keyring_fingerprint": pinned.fingerprint, "allow_change": True},
    )
    first, _ = deploy_twice(allowed, DEPLOY)
    assert first.changed()[OP] == ["node3"]
    assert versions(lab, "node3") == PINNED
    assert sorted(lab.ssh("node3", "apt-mark showhold").split()) == sorted(PINNED)
