"""The software stack: the exact CUDA, cuDNN, NCCL, OpenMPI packages, held, and the node's
PyTorch venv with its pinned packages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainfleet.compare import ABSENT, PYTHON_PREFIX
from trainfleet.defaults import CUDA_KEYRING_FINGERPRINT, CUDA_REPOS, VENV_DIR
from trainfleet.model import Cluster, Node
from trainfleet.pins import (
    PINNED_PACKAGES,
    Pins,
    package_pins,
    torch_requirement,
    venv_pins,
    without_requirements,
)
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks

MAJORITY = ("os", "kernel", "cuda", "torch", "gcc", "package ", PYTHON_PREFIX)


@dataclass(frozen=True)
class StackPlan:
    """The node's software stack, as operations/stack_ops.py applies it and drift expects it
    (the spec's ``stack`` resolved for the node; ``driver`` on GPU nodes only)."""

    packages: Pins = field(default_factory=dict)  # exact packages for the node's OS family
    torch: str | None = None  # the version ``torch.__version__`` must report
    python: Mapping[str, str] = field(default_factory=dict)  # venv pins: PEP 503 name -> version
    problems: list[str] = field(default_factory=list)
    pinned: frozenset[str] = frozenset()  # of STACK_COMPONENTS, those the spec pins
    cuda: str | None = None  # stack.cuda as pinned, e.g. "12.4.1"
    cuda_repo: str = CUDA_REPOS  # the CUDA repositories' root
    insecure: bool = False  # an http:// cuda_repo is allowed
    keyring_fingerprint: str = CUDA_KEYRING_FINGERPRINT  # the one key the cuda-keyring may hold
    gcc: str | None = None  # the GCC major version
    torch_variant: str = "cpu"  # the wheel index's CUDA variant, e.g. "cu124"
    torch_index: str | None = None  # a mirror of that index
    wheelhouse: str | None = None  # a wheel directory on the node (air-gapped)
    no_deps: list[str] = field(default_factory=list)  # venv packages installed without their deps
    allow_change: bool = False  # installed versions other than the pins may be replaced


# The spec's stack entries that each install something.
STACK_COMPONENTS = ("cuda", "cudnn", "nccl", "openmpi", "gcc", "torch", "driver")


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
    variant = stack.get("torch_cuda") or "cpu"
    torch = (
        torch_requirement(stack["torch"], variant).split("==", 1)[1] if stack.get("torch") else None
    )
    python = stack.get("python") or {}
    return StackPlan(
        packages=packages,
        torch=torch,
        python=venv_pins(python),
        problems=problems,
        pinned=frozenset(key for key in STACK_COMPONENTS if stack.get(key)),
        cuda=stack.get("cuda") or None,
        cuda_repo=stack.get("cuda_repo") or CUDA_REPOS,
        insecure=bool(stack.get("insecure", False)),
        keyring_fingerprint=stack.get("cuda_keyring_fingerprint") or CUDA_KEYRING_FINGERPRINT,
        gcc=str(stack["gcc"]) if stack.get("gcc") else None,
        torch_variant=variant,
        torch_index=stack.get("torch_index"),
        wheelhouse=stack.get("wheelhouse"),
        no_deps=without_requirements(python),
        allow_change=bool(stack.get("allow_change")),
    )


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {"stack": ("StackVersions", {"venv": VENV_DIR})}


def plan_part(ctx: PlanContext, node: Node) -> StackPlan:
    family = ctx.gathered.os_families.get(node.name)
    return stack_part(ctx.cluster.stack, family, node.gpus)


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
    if stack.cuda:
        props["cuda"] = ".".join(stack.cuda.split(".")[:2])
    props.update(
        {f"package {name}": version for name, version in stack.packages.items() if version}
    )
    props.update({f"package {name} hold": "held" for name in stack.packages})  # each pin held
    props.update({f"{PYTHON_PREFIX}{name}": version for name, version in stack.python.items()})
    return props


def converged(plan: NodePlan) -> dict[str, Any]:
    """The planned versions installed and held; nvcc reports the planned CUDA release, the
    venv's torch the planned one. What the plan does not pin (nvcc, torch, gcc) is the
    node's own: a converged node keeps what it has."""
    stack = plan.stack
    cuda = stack.cuda
    planned: dict[str, Any] = {
        "packages": {name: version or "any" for name, version in stack.packages.items()},
        "held": list(stack.packages),
        "venv_packages": dict(stack.python),
    }
    if cuda:
        planned["nvcc"] = {"release": ".".join(cuda.split(".")[:2])}
    if stack.torch:
        planned["torch"] = {"version": stack.torch}
    return {"stack": planned}
