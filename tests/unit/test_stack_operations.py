"""Stack operations against fact data (tests/fixtures/stack/<op>), and their pure builders."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

from operations.stack import cuda_distro, package_pins, torch_requirement

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stack"

TestCudaRepo = make_operation_tests("operations", "stack.cuda_repo", FIXTURES / "cuda_repo")
TestPackages = make_operation_tests("operations", "stack.packages", FIXTURES / "packages")
TestGcc = make_operation_tests("operations", "stack.gcc", FIXTURES / "gcc")
TestTorchVenv = make_operation_tests("operations", "stack.torch_venv", FIXTURES / "torch_venv")
# What deploy/cluster.py calls: the whole stack from one fact read; a refused part changes nothing.
TestSoftware = make_operation_tests("operations", "stack.software", FIXTURES / "software")

PROD = {"cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5-1", "torch": "2.4.1", "torch_cuda": "cu124", "gcc": "11"}


def test_prod_stack_pins_per_family():
    assert package_pins(PROD, "debian") == {
        "cuda-toolkit-12-4": None,
        "libcudnn9-cuda-12": "9.1.0.70-1",
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
    }
    assert list(package_pins(PROD, "rhel")) == ["cuda-toolkit-12-4", "libcudnn9-cuda-12", "libnccl", "libnccl-devel"]


def test_full_versions_are_taken_as_given():
    pins = package_pins({"cuda": "12.4.1", "cudnn": "8.9.7.29-1+cuda12.2", "nccl": "2.21.5-1+cuda12.4"}, "debian")
    assert pins == {"cuda-toolkit-12-4": "12.4.1-1", "libcudnn8": "8.9.7.29-1+cuda12.2",
                    "libnccl2": "2.21.5-1+cuda12.4", "libnccl-dev": "2.21.5-1+cuda12.4"}


def test_unmanaged_components_pin_nothing():
    assert package_pins({"cuda": None, "cudnn": None, "nccl": None}, "debian") == {}
    with pytest.raises(ValueError):
        package_pins({"cudnn": "9.1.0.70"}, "debian")


@pytest.mark.parametrize(("os_id", "version", "distro"), [
    ("ubuntu", "22.04", "ubuntu2204"), ("debian", "12", "debian12"),
    ("rocky", "9.4", "rhel9"), ("centos", "7", "rhel7"), ("almalinux", "8.10", "rhel8"),
])
def test_nvidia_repo_names(os_id, version, distro):
    family = "debian" if os_id in ("ubuntu", "debian") else "rhel"
    assert cuda_distro({"id": os_id, "family": family, "version": version, "package_manager": None}) == distro


def test_torch_requirement_is_the_exact_build():
    assert torch_requirement("2.4.1", "cu124") == "torch==2.4.1+cu124"
    assert torch_requirement("2.4.1+cu121", "cu124") == "torch==2.4.1+cu121"
