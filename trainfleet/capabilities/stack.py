"""The software stack: the exact CUDA, cuDNN, NCCL, OpenMPI packages, held, and the node's
PyTorch venv with its pinned packages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trainfleet.compare import ABSENT, PYTHON_PREFIX
from trainfleet.defaults import CUDA_KEYRING_FINGERPRINT, CUDA_REPOS, VENV_DIR
from trainfleet.grammar import (
    NULL,
    Key,
    Section,
    dist_name_problem,
    fingerprint_problem,
    node_path_problem,
    pattern,
    python_pin_problem,
    url_problem,
)
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
    """The planned versions installed and held; nvcc reports the planned CUDA release."""
    stack = plan.stack
    cuda = stack.cuda
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


# The spec's section: `stack` (trainfleet/schema.py composes the spec)

STACK = Section(
    doc="Pinned software stack; null leaves that component unmanaged. Every node gets exactly "
    "these.",
    keys={
        "cuda": Key(
            (str, NULL),
            None,
            "CUDA toolkit version.",
            check=pattern(r"\d+\.\d+(\.\d+)?", "12.4"),
            example="12.4",
            accepts="`12.4`, `12.4.1`",
        ),
        "cudnn": Key(
            (str, NULL),
            None,
            "cuDNN version.",
            check=pattern(r"\d+(\.\d+){1,3}(-\d+(\+cuda\d+\.\d+)?)?", "9.1.0.70"),
            example="9.1.0.70",
            accepts="`9.1.0.70`, `9.1.0.70-1+cuda12.4`",
        ),
        "nccl": Key(
            (str, NULL),
            None,
            "NCCL version (libnccl2).",
            check=pattern(r"\d+\.\d+\.\d+(-\d+(\+cuda\d+\.\d+)?)?", "2.21.5-1"),
            example="2.21.5-1",
            accepts="`2.21.5`, `2.21.5-1+cuda12.4`",
        ),
        "torch": Key(
            (str, NULL),
            None,
            "PyTorch version in the node venv.",
            check=pattern(r"\d+\.\d+\.\d+(\+[a-z0-9]+)?", "2.4.1"),
            example="2.4.1",
            accepts="`2.4.1`, `2.4.1+cu124`",
        ),
        "torch_cuda": Key(
            (str, NULL),
            None,
            "PyTorch CUDA variant (wheel index).",
            check=pattern(r"cu\d{3,4}|cpu", "cu124"),
            example="cu124",
            accepts="`cu124`, `cpu`",
        ),
        "openmpi": Key(
            (str, NULL),
            None,
            "OpenMPI package version (Debian/Ubuntu `openmpi-bin`, RHEL `openmpi`), exact and "
            "held: the runtime `mpirun.sh` and `horovod.sh` use.",
            check=pattern(r"\d+\.\d+(\.\d+)?-[0-9A-Za-z.+~]+", "4.1.4-3+b1"),
            example="4.1.4-3+b1",
            accepts="the package version with its release, as `apt-cache policy openmpi-bin` or "
            "`dnf list openmpi` shows it: `4.1.4-3+b1`, `4.1.1-5.el8`",
        ),
        "python": Key(
            dict,
            {},
            "Python packages in the node venv beside torch, each at exactly this version "
            "(from `wheelhouse`, else the node's pip index); never upgraded silently.",
            each_key=dist_name_problem,
            each=python_pin_problem,
            example={"accelerate": "1.15.0", "deepspeed": "0.19.8"},
            accepts="names `[A-Za-z0-9._-]`; exact versions as strings: `1.15.0`, `2.1.0rc1`, "
            "`0.4.post1`, or `{version: V, deps: false}` to install one without its requirements",
        ),
        "driver": Key(
            (str, NULL),
            None,
            "NVIDIA driver on nodes with GPUs: a branch (`550`: its newest release) or an exact "
            "version, installed and held; at least what `stack.cuda` needs (CUDA 12.x: 525.60.13).",
            check=pattern(r"[0-9]{3}(\.[0-9]{1,3}){0,2}", "550.54.15"),
            example="550.54.15",
            accepts="`550`, `550.54.15`",
        ),
        "gcc": Key(
            (str, NULL),
            None,
            "GCC major version (devtoolset / gcc-toolset / gcc-N).",
            check=pattern(r"\d{1,2}", "11"),
            example="11",
            accepts="1-2 digits",
        ),
        "wheelhouse": Key(
            (str, NULL),
            None,
            "Directory on every node holding torch and its dependency wheels (air-gapped "
            "clusters); null: the variant's index.",
            check=node_path_problem,
            accepts="absolute path of `[A-Za-z0-9._+@,=:~-]` names, no `..`",
        ),
        "torch_index": Key(
            (str, NULL),
            None,
            "Mirror of the PyTorch wheel index; null: download.pytorch.org/whl/<torch_cuda>.",
            check=url_problem,
            accepts="`https://host[:port]/path` of `[A-Za-z0-9._~%/:+-]`",
        ),
        "cuda_repo": Key(
            (str, NULL),
            None,
            "Mirror of NVIDIA's CUDA repositories root; null: developer.download.nvidia.com.",
            check=lambda v: url_problem(v, file_ok=True),
            accepts="`https://host[:port]/path` of `[A-Za-z0-9._~%/:+-]`, or `file:///path` on the "
            "nodes",
        ),
        "cuda_keyring_fingerprint": Key(
            (str, NULL),
            None,
            "The one key the cuda-keyring .deb may hold (checked before it is installed); null: "
            "NVIDIA's, pinned in trainfleet/defaults.py. For a mirror signed with its own key.",
            check=fingerprint_problem,
            accepts="40 hex digits, upper case",
        ),
        "insecure": Key(
            bool,
            False,
            "Allow plain-http mirrors (`cuda_repo`, `torch_index`); never for production.",
            accepts="`true`, `false`",
        ),
        "allow_change": Key(
            bool,
            False,
            "Let the deploy move a node whose installed CUDA/cuDNN/NCCL differs from the pins; "
            "false: such a node fails, unchanged.",
            accepts="`true`, `false`",
        ),
    },
)
