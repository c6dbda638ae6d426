"""The one exact-and-held package helper (operations/packages_ops.py), and the stack operation
taking its values from the plan (never the raw spec)."""

from __future__ import annotations

from pathlib import Path

from pyinfra_testing.operations import make_operation_tests

from operations.packages_ops import install_any, package_change
from trainfleet.capabilities.stack import stack_part
from trainfleet.defaults import CUDA_KEYRING_FINGERPRINT, CUDA_REPOS

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "packages"

TestHeld = make_operation_tests("operations", "packages_ops.held", FIXTURES / "held")

UBUNTU = {"id": "ubuntu", "family": "debian", "version": "22.04", "package_manager": "apt"}
ROCKY = {"id": "rocky", "family": "rhel", "version": "9.4", "package_manager": "dnf"}


def test_a_change_installs_missing_and_other_versions_and_holds_them():
    change = package_change(
        {"a": "1-1", "b": "2-1", "c": None, "d": "4-1"},
        installed={"b": "2-2", "c": "9", "d": "4-1"},
        held=["b", "d"],
    )
    assert change.install == ["a", "b"]
    assert change.changes == {"b": "2-2"}
    assert change.hold == ["a", "b", "c"]  # d is in place and held: left alone
    assert change.unlock == ["b"]


def test_a_version_comparison_can_ignore_the_release():
    def same(have: str, pin: str) -> bool:
        return have.split("-")[0] == pin.split("-")[0]

    change = package_change({"fm": "565.57.01-1"}, {"fm": "565.57.01-2"}, ["fm"], same=same)
    assert (change.install, change.hold) == ([], [])


def test_any_version_installs_update_apt_lists_only_when_needed_and_enable_epel():
    apt = install_any(UBUNTU, ["pdsh"], ["pdsh", "pdsh-rcmd-ssh"], "pdsh").get_raw_value()
    assert apt == (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q pdsh || "
        "{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pdsh; }"
    )
    dnf = install_any(ROCKY, ["pdsh"], ["pdsh", "pdsh-rcmd-ssh"], "pdsh").get_raw_value()
    assert dnf.startswith("(rpm -q epel-release >/dev/null 2>&1 || dnf install -y epel-release)")
    assert "pdsh comes from EPEL" in dnf


SPEC = {
    "cuda": "12.4.1",
    "nccl": "2.21.5-1",
    "openmpi": "4.1.2-2ubuntu1",
    "gcc": 11,
    "torch": "2.4.1",
    "torch_cuda": "cu124",
    "torch_index": "https://mirror.example.com/whl/cu124",
    "wheelhouse": None,
    "cuda_repo": "https://mirror.example.com/nvidia/cuda/repos",
    "insecure": False,
    "cuda_keyring_fingerprint": "09E5C934AFB96923BC8AB76EE6BFE6072000A658",
    "allow_change": True,
    "python": {"deepspeed": "0.19.8", "ColossalAI": {"version": "0.5.0", "deps": False}},
}


def test_the_stack_plan_carries_every_value_its_operations_take():
    plan = stack_part(SPEC, "debian", gpus=0)
    assert plan.packages == {
        "cuda-toolkit-12-4": "12.4.1-1",
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
        "openmpi-bin": "4.1.2-2ubuntu1",
    }
    assert plan.pinned == {"cuda", "nccl", "openmpi", "gcc", "torch"}
    assert (plan.cuda, plan.gcc, plan.torch, plan.torch_variant) == (
        "12.4.1",
        "11",
        "2.4.1+cu124",
        "cu124",
    )
    assert (plan.cuda_repo, plan.insecure, plan.keyring_fingerprint) == (
        SPEC["cuda_repo"],
        False,
        SPEC["cuda_keyring_fingerprint"],
    )
    assert (plan.torch_index, plan.wheelhouse, plan.allow_change) == (
        SPEC["torch_index"],
        None,
        True,
    )
    assert plan.python == {"colossalai": "0.5.0", "deepspeed": "0.19.8"}
    assert plan.no_deps == ["colossalai"]
    default = stack_part({"cuda": "12.4"}, "rhel")
    assert (default.cuda_repo, default.keyring_fingerprint, default.allow_change) == (
        CUDA_REPOS,
        CUDA_KEYRING_FINGERPRINT,
        False,
    )


def test_the_deploy_gives_the_stack_operation_the_nodes_plan_and_nothing_of_the_spec(
    monkeypatch, tmp_path
):
    from tests.unit.test_plan import deploy_calls, three_node_plan

    cluster, plan = three_node_plan(tmp_path)
    calls = deploy_calls(monkeypatch, cluster, "gpu-a02", plan)
    stack = plan.nodes["gpu-a02"].stack
    ((software,),) = [calls["stack.software"]]
    assert set(software) == {"name", "stack"}  # no spec section, no other value
    assert software["stack"] is stack
    assert stack.packages == {  # resolved for the node's OS family (debian) by the plan
        "cuda-toolkit-12-4": None,
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
    }
    assert (stack.torch, stack.torch_variant, stack.cuda_repo) == ("2.4.1+cpu", "cpu", CUDA_REPOS)
    ((gpu,),) = [calls["gpu_node.settings"]]
    assert set(gpu) == {"name", "gpu"} and gpu["gpu"].allow_change is stack.allow_change is False
