"""The software stack: the exact CUDA, cuDNN, NCCL, OpenMPI packages, held, and the node's
PyTorch venv with its pinned packages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainfleet.capabilities.plan_context import PlanContext, Sections
from trainfleet.compare import ABSENT, PYTHON_PREFIX
from trainfleet.defaults import VENV_DIR
from trainfleet.model import Cluster, Node
from trainfleet.pins import (
    PINNED_PACKAGES,
    Pins,
    package_pins,
    torch_requirement,
    venv_pins,
)

if TYPE_CHECKING:
    from trainfleet.compare import Content
    from trainfleet.plan import NodePlan

MAJORITY = ("os", "kernel", "cuda", "torch", "gcc", "package ", PYTHON_PREFIX)
UNIQUE: tuple[str, ...] = ()


@dataclass(frozen=True)
class StackPlan:
    # the spec's ``stack`` section as operations/stack_ops.py takes it (``driver``: GPU nodes)
    spec: Mapping[str, Any]
    packages: Pins  # the exact packages for the node's OS family (empty when it is unknown)
    torch: str | None  # the version ``torch.__version__`` must report
    python: Mapping[str, str]  # the venv's other pinned packages: PEP 503 name -> exact version
    problems: list[str]


def stack_part(stack: Mapping[str, Any], family: str | None, gpus: int = 0) -> StackPlan:
    problems: list[str] = []
    if not gpus and stack.get("driver"):  # the NVIDIA driver is for nodes with GPUs only
        stack = {key: value for key, value in stack.items() if key != "driver"}
    packages: Pins = {}
    if family in ("debian", "rhel"):
        try:
            packages = package_pins(stack, family)
        except ValueError as exc:
            problems.append(str(exc))
    torch = (
        torch_requirement(stack["torch"], stack.get("torch_cuda") or "cpu").split("==", 1)[1]
        if stack.get("torch")
        else None
    )
    python = venv_pins(stack.get("python") or {})
    return StackPlan(spec=stack, packages=packages, torch=torch, python=python, problems=problems)


def deploy_sections(users: list[str]) -> Sections:
    return {"stack": ("StackVersions", {"venv": VENV_DIR})}


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {}


def plan_part(ctx: PlanContext, node: Node) -> dict[str, Any]:
    family = ctx.gathered.os_families.get(node.name)
    return {"stack": stack_part(ctx.cluster.stack, family, node.gpus)}


def package_props(stack: Mapping[str, Any]) -> dict[str, str]:
    """Each installed stack package's version, and whether it is held (``apt-mark hold``, dnf/yum
    versionlock): a released hold is drift before an upgrade moves the package."""
    props = {}
    for name, version in sorted(stack.get("packages", {}).items()):
        if re.match(PINNED_PACKAGES, name):
            props[f"package {name}"] = version
            props[f"package {name} hold"] = "held" if name in stack.get("held", []) else "not held"
    return props


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    stack = fp["stack"]
    props = {
        "cuda": (stack.get("nvcc") or {}).get("release") or ABSENT,
        "torch": (stack.get("torch") or {}).get("version") or ABSENT,
        "gcc": (stack.get("gcc") or {}).get("version") or ABSENT,
    }
    for name, version in stack.get("venv_packages", {}).items():
        props[f"{PYTHON_PREFIX}{name}"] = version
    props.update(package_props(stack))
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    stack = plan.stack
    props = {}
    if stack.torch:
        props["torch"] = stack.torch
    if stack.spec.get("cuda"):
        props["cuda"] = ".".join(stack.spec["cuda"].split(".")[:2])
    props.update(
        {f"package {name}": version for name, version in stack.packages.items() if version}
    )
    props.update({f"package {name} hold": "held" for name in stack.packages})  # each pin held
    props.update({f"{PYTHON_PREFIX}{name}": version for name, version in stack.python.items()})
    return props


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    return {}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {}


def converged(plan: NodePlan) -> dict[str, Any]:
    """The planned versions installed and held; nvcc reports the planned CUDA release."""
    stack = plan.stack
    cuda = stack.spec.get("cuda")
    return {
        "stack": {
            "packages": {name: version or "any" for name, version in stack.packages.items()},
            "held": list(stack.packages),
            "nvcc": {"release": ".".join(cuda.split(".")[:2])} if cuda else None,
            "torch": {"version": stack.torch} if stack.torch else None,
            "gcc": None,
            "venv_packages": dict(stack.python),
        }
    }
