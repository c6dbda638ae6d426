"""The software stack: the exact CUDA, cuDNN, NCCL, OpenMPI packages, held, and the node's
PyTorch venv with its pinned packages."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from trainfleet.compare import ABSENT, PYTHON_PREFIX, Content, content, digest
from trainfleet.defaults import (
    CUDA_KEYRING,
    CUDA_KEYRING_FINGERPRINT,
    CUDA_REPOS,
    GCC_PROFILE,
    VENV_DIR,
)
from trainfleet.grammar import (
    NULL,
    Key,
    Section,
    dist_name_problem,
    fingerprint_problem,
    node_path_problem,
    pattern,
    python_pin_problem,
    released,
    url_problem,
)
from trainfleet.model import Cluster, Node
from trainfleet.osfamily import OsFamilyT
from trainfleet.pins import (
    PINNED_PACKAGES,
    Pins,
    package_pins,
    satisfies,
    torch_requirement,
    venv_pins,
    without_requirements,
)
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.releases import cuda_problem, torch_problem
from trainfleet.render import render

# every property it expects is its step's (manage.stack)
MANAGED = MappingProxyType({"stack": ("",)})

MAJORITY = ("os", "kernel", "cuda", "torch", "gcc", "package ", PYTHON_PREFIX)
ABSENT_ELSEWHERE = (PYTHON_PREFIX,)  # a package in one node's venv only: absent on the others


def met(prop: str, have: str, pin: str) -> bool:
    """A venv pin means what pip's ``==`` means (1.0 is 1.0.0)."""
    return prop.startswith(PYTHON_PREFIX) and satisfies(have, pin)


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
    # The files the stack's operation writes, rendered here (templates/stack/) from the node's
    # OS as its StackVersions fact read it; empty where not pinned or the OS was not read.
    cuda_repo_url: str | None = None  # <cuda_repo>/<distro>/<arch>: the node's CUDA repository
    # its apt list or .repo file: path -> text
    repo_files: Mapping[str, str] = field(default_factory=dict)
    gcc_toolset: str | None = None  # RHEL-family: the devtoolset/gcc-toolset that brings ``gcc``
    # GCC_PROFILE -> its text; None: the file must be absent (the system gcc is the pinned one)
    gcc_files: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def files(self) -> dict[str, str | None]:
        """Every file the stack manages on the node: path -> text (None: must be absent)."""
        return {**self.repo_files, **self.gcc_files}


# The spec's stack entries that each install something.
STACK_COMPONENTS = ("cuda", "cudnn", "nccl", "openmpi", "gcc", "torch", "driver")
# The components whose packages come from NVIDIA's CUDA repository, and all packaged ones.
FROM_CUDA_REPO = frozenset({"cuda", "cudnn", "nccl", "driver"})
PACKAGED = FROM_CUDA_REPO | {"openmpi"}
CUDA_ARCH = "x86_64"  # NVIDIA's directory for the nodes' architecture ("sbsa": Arm servers)
RPM_GPG_KEY = "D42D0685.pub"  # NVIDIA's RPM repo key since the 2022 rotation
_DISTRO = re.compile(r"[a-z]+[0-9]+")  # a name, its version's digits: nothing else is a path part


def cuda_distro(os_: OsFamilyT) -> str | None:
    """NVIDIA's repo directory for an OS: ubuntu2204, debian12, rhel9, rhel7, fedora39."""
    major = os_["version"].split(".")[0]
    name = None
    if os_["id"] == "ubuntu":
        name = "ubuntu" + os_["version"].replace(".", "")
    elif os_["id"] == "debian":
        name = "debian" + major
    elif os_["id"] == "fedora":
        name = "fedora" + major
    elif os_["family"] == "rhel" and major:
        name = "rhel" + major
    return name if name and _DISTRO.fullmatch(name) else None


def cuda_repo_files(mirror: str, os_: OsFamilyT) -> tuple[str | None, dict[str, str]]:
    """The node's CUDA repository URL and the file that configures it (path -> text): apt's
    list at the path NVIDIA's cuda-keyring package itself writes (so the official URL
    converges with no change), or the .repo file with ``gpgcheck=1``. Nothing where the OS
    has no package manager or no NVIDIA repository."""
    distro = cuda_distro(os_)
    if distro is None or os_["package_manager"] is None:
        return None, {}
    base = f"{mirror.rstrip('/')}/{distro}/{CUDA_ARCH}"
    if os_["family"] == "debian":
        path = f"/etc/apt/sources.list.d/cuda-{distro}-{CUDA_ARCH}.list"
        return base, {path: render("stack/cuda.list.j2", keyring=CUDA_KEYRING, base=base)}
    path = f"/etc/yum.repos.d/cuda-{distro}.repo"
    text = render(
        "stack/cuda.repo.j2", distro=distro, arch=CUDA_ARCH, base=base, gpg_key=RPM_GPG_KEY
    )
    return base, {path: text}


def toolset_name(os_: OsFamilyT, major: int) -> str:
    """``devtoolset-N`` on EL7 (Software Collections), ``gcc-toolset-N`` on EL8/9."""
    return f"devtoolset-{major}" if os_["package_manager"] == "yum" else f"gcc-toolset-{major}"


def gcc_profile_files(
    gcc: str | None, os_: OsFamilyT, system_gcc: int | None
) -> tuple[str | None, dict[str, str | None]]:
    """On RHEL-family with ``gcc`` pinned: the toolset that brings it and GCC_PROFILE, which
    enables it for login shells; the profile absent (and no toolset) where the system gcc
    (``system_gcc``, its major) is the pin. Debian/Ubuntu select gcc-N with
    update-alternatives: no file."""
    if not gcc or not re.fullmatch(r"[0-9]{1,2}", gcc) or os_["family"] != "rhel":
        return None, {}
    if system_gcc == int(gcc):
        return None, {GCC_PROFILE: None}
    toolset = toolset_name(os_, int(gcc))
    enable = f"/opt/rh/{toolset}/enable"
    return toolset, {GCC_PROFILE: render("stack/gcc_profile.sh.j2", toolset=toolset, enable=enable)}


def with_files(plan: StackPlan, found: Mapping[str, Any] | None) -> StackPlan:
    """``plan`` with the files the operation writes, rendered for the node's OS as its
    StackVersions fact (``found``) read it; None (not read): none rendered."""
    if not found:
        return plan
    os_ = found["os"]
    url: str | None = None
    repo: dict[str, str] = {}
    if not FROM_CUDA_REPO.isdisjoint(plan.pinned):
        url, repo = cuda_repo_files(plan.cuda_repo, os_)
    system = (found.get("system_gcc") or {}).get("major")  # not PATH: a toolset would mask it
    toolset, gcc = gcc_profile_files(plan.gcc, os_, system)
    return replace(plan, cuda_repo_url=url, repo_files=repo, gcc_toolset=toolset, gcc_files=gcc)


def stack_part(
    stack: Mapping[str, Any],
    family: str | None,
    gpus: int = 0,
    found: Mapping[str, Any] | None = None,
) -> StackPlan:
    """The node's StackPlan from the spec's ``stack``, its OS family and GPU count, and its
    StackVersions fact (``found``), which the files the operation writes are rendered for."""
    return with_files(stack_versions(stack, family, gpus), found)


def stack_versions(stack: Mapping[str, Any], family: str | None, gpus: int = 0) -> StackPlan:
    """The pins: packages for the OS family, the torch build, the venv's, and their settings."""
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


def part(plan: NodePlan) -> StackPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("stack", StackPlan)


def plan_part(ctx: PlanContext, node: Node) -> StackPlan:
    family = ctx.gathered.os_families.get(node.name)
    found = ctx.gathered.stacks.get(node.name)
    return stack_part(ctx.cluster.stack, family, node.gpus, found)


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
    if part(plan).files:
        props[STACK_FILES] = files_digest(
            {path: found_file(stack, path) for path in part(plan).files}
        )
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    stack = part(plan)
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
    if stack.files:
        props[STACK_FILES] = files_digest(stack.files)
    return props


STACK_FILES = "stack files"  # the CUDA repository's file and gcc's profile, as planned


def found_file(stack: Mapping[str, Any], path: str) -> str | None:
    """A managed file's text as the StackVersions fact read it (None: absent)."""
    text = stack.get("gcc_profile") if path == GCC_PROFILE else stack.get("repos", {}).get(path)
    return None if text is None else str(text)


def files_digest(files: Mapping[str, str | None]) -> str:
    """One value for the managed files: each path with its text's digest (or absent)."""
    return digest([f"{path} {digest(files[path])}" for path in sorted(files)])


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    """Every CUDA repository file the fact read, and gcc's profile where there is one."""
    stack = fp["stack"]
    files = {path: content(text) for path, text in stack.get("repos", {}).items()}
    if stack.get("gcc_profile") is not None:
        files[GCC_PROFILE] = content(stack["gcc_profile"])
    return {STACK_FILES: files}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    files = part(plan).files
    return {STACK_FILES: {path: content(text) for path, text in files.items() if text is not None}}


def converged(plan: NodePlan) -> dict[str, Any]:
    """The planned versions installed and held; nvcc reports the planned CUDA release, the
    venv's torch the planned one; the planned CUDA repository file and gcc profile in place.
    What the plan does not pin (nvcc, torch, gcc) is the node's own: a converged node keeps
    what it has."""
    stack = part(plan)
    cuda = stack.cuda
    planned: dict[str, Any] = {
        "packages": {name: version or "any" for name, version in stack.packages.items()},
        "held": list(stack.packages),
        "venv_packages": dict(stack.python),
        "repos": dict(stack.repo_files),
        "gcc_profile": stack.gcc_files.get(GCC_PROFILE),
    }
    if cuda:
        planned["nvcc"] = {"release": ".".join(cuda.split(".")[:2])}
    if stack.torch:
        planned["torch"] = {"version": stack.torch}
    return {"stack": planned}


# The spec's section: `stack` (trainfleet/schema.py composes the spec)

STACK = Section(
    doc="Pinned software stack; null leaves that component unmanaged. Every node gets exactly "
    "these.",
    keys={
        "cuda": Key(
            (str, NULL),
            None,
            "CUDA toolkit version.",
            check=released(pattern(r"\d+\.\d+(\.\d+)?", "12.4"), cuda_problem),
            example="12.4",
            accepts="`12.4`, `12.4.1`",
        ),
        "cudnn": Key(
            (str, NULL),
            None,
            "cuDNN version.",
            # cuDNN's packages are versioned major.minor.patch.build: "9.1" names none
            check=pattern(r"\d+(\.\d+){2,3}(-\d+(\+cuda\d+\.\d+)?)?", "9.1.0.70"),
            example="9.1.0.70",
            accepts="`9.1.0.70`, `9.1.0.70-1+cuda12.4` (at least major.minor.patch)",
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
            check=released(pattern(r"\d+\.\d+\.\d+(\+[a-z0-9]+)?", "2.4.1"), torch_problem),
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
            # a branch, or a release's three parts: "550.54" is neither (no package has it)
            check=pattern(r"[0-9]{3}(\.[0-9]{1,3}\.[0-9]{1,3})?", "550.54.15"),
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
