"""Fact of the pinned software stack: what a node has installed and what its venv loads."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import SECTION, split_sections
from facts.os_release_facts import OS_FAMILY_SH
from facts.shell import script, shell
from trainfleet.defaults import GCC_PROFILE
from trainfleet.grammar import normalized_dist
from trainfleet.osfamily import OsFamilyT, os_release
from trainfleet.pins import PINNED_PACKAGES

_SECTION = SECTION

# Every probe guards itself: a missing tool prints nothing, and the script always exits 0.
# The one os-release fragment (facts/os_release_facts.py) goes in after the arguments line.
_ARGS, _PROBES = script("stack.sh").split("py=$4\n", 1)
# Shell functions also run outside this fact: gpu_pids by the remediation's fact and reset,
# busy_probe by the software operation's guard (operations/stack_busy_ops.py)
GPU_PIDS = script("gpu_pids.sh")
BUSY_PROBE = GPU_PIDS + script("stack_busy.sh")
_SCRIPT = f"{_ARGS}py=$4\n{OS_FAMILY_SH}\n{BUSY_PROBE}{_PROBES}"

# Run by the venv's python: every distribution it has (importlib.metadata: no pip started),
# then what torch reports. CUDA calls only when a GPU is usable; every call guarded.
_PY = script("stack_versions.py")

_NVCC = re.compile(r"release (\S+), V(\S+)")
_PKG = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*) (\S+)", re.ASCII)
_GCC = re.compile(r"^\S+ \(.*?\) ((\d+)\.\d+\S*)")  # "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0"
_STACK_NAME = re.compile(PINNED_PACKAGES)


class NvccT(TypedDict):
    path: str
    release: str  # "12.4"
    version: str  # "12.4.131"


class TorchT(TypedDict):
    version: str  # torch.__version__, "2.4.1+cu124"
    cuda: str | None  # torch.version.cuda: the CUDA it was built for; None for a CPU build
    gpu: bool  # torch.cuda.is_available()
    cudnn: int | None  # torch.backends.cudnn.version(), only when gpu
    nccl: str | None  # torch.cuda.nccl.version() as "2.20.5", only when gpu


class GccT(TypedDict):
    line: str  # first line of `gcc --version`
    version: str  # "11.4.0"
    major: int | None


class StackVersionsT(TypedDict):
    os: OsFamilyT
    packages: dict[
        str, str
    ]  # installed cuda-toolkit-*/libcudnn*/libnccl*/openmpi(-bin)/cuda-drivers* -> version
    held: list[str]  # those held (dpkg selection "hold") or version-locked (dnf/yum)
    keyring: bool  # the CUDA apt keyring is installed
    repos: dict[str, str]  # cuda*.list / cuda*.repo path -> content
    nvcc: NvccT | None
    venv: bool  # the venv's python exists
    venv_packages: dict[str, str]  # every distribution in the venv, PEP 503 name -> version
    torch: TorchT | None
    gcc: GccT | None  # the active gcc, first on PATH (RHEL's /etc/bashrc may source a toolset)
    system_gcc: GccT | None  # /usr/bin/gcc (on Debian: the update-alternatives choice)
    toolsets: dict[str, GccT]  # /opt/rh/<name> -> its gcc (devtoolset-N, gcc-toolset-N)
    gcc_profile: str | None  # content of GCC_PROFILE
    # "venv": pids mapping a file of the venv; "gpu": GPU processes; "unknown": the probes that
    # could not answer ("venv", "gpu"): a job there cannot be ruled out
    busy: dict[str, list]


def gcc_info(line: str) -> GccT | None:
    if not line:
        return None
    match = _GCC.match(line)
    return {
        "line": line,
        "version": match.group(1) if match else "",
        "major": int(match.group(2)) if match else None,
    }


def lock_name(entry: str) -> str:
    """Package name of a versionlock entry.

    dnf writes ``libnccl-0:2.21.5-1+cuda12.4.*``, EL7's yum ``0:libnccl-2.21.5-1+cuda12.4.*``.
    """
    entry = re.sub(r"^\d+:", "", entry)
    return entry.rsplit("-", 2)[0]


def _none(value: str) -> str | None:
    return None if value in ("", "None") else value


# ---- the script's tagged lines, before the file sections -----------------------------------


@dataclass
class Listed:
    """What the script's lines say, by their first word (the tag)."""

    head: dict[str, str] = field(default_factory=dict)  # untagged: os-release, nvcc, gcc, venv
    deb: dict[str, str] = field(default_factory=dict)  # installed Debian package -> version
    deb_held: list[str] = field(default_factory=list)  # those dpkg's selection holds
    rpm: dict[str, str] = field(default_factory=dict)
    locks: list[str] = field(default_factory=list)  # package names of versionlock entries
    toolsets: dict[str, GccT] = field(default_factory=dict)
    torch: dict[str, str] = field(default_factory=dict)  # torch, torch_cuda, torch_gpu, ...
    venv_packages: dict[str, str] = field(default_factory=dict)
    busy: dict[str, list[int | str]] = field(
        default_factory=lambda: {"venv": [], "gpu": [], "unknown": []}
    )


def _deb(listed: Listed, rest: str) -> None:
    """``deb hold ok installed libnccl2 2.21.5-1+cuda12.4``: dpkg's status, name, version."""
    want, _ok, status, name, version = (rest.split() + [""] * 5)[:5]
    if status == "installed":
        listed.deb[name] = version
        if want == "hold":
            listed.deb_held.append(name)


def _rpm(listed: Listed, rest: str) -> None:
    name, _, version = rest.partition(" ")
    listed.rpm[name] = version


def _lock(listed: Listed, rest: str) -> None:
    listed.locks.append(lock_name(rest.strip()))


def _toolset(listed: Listed, rest: str) -> None:
    name, _, gcc_line = rest.partition(" ")
    info = gcc_info(gcc_line.strip())
    if info:
        listed.toolsets[name] = info


def _venv_package(listed: Listed, rest: str) -> None:
    match = _PKG.fullmatch(rest)
    if match:
        # the first on the path is what imports and pip see (a stale .dist-info later)
        listed.venv_packages.setdefault(normalized_dist(match.group(1)), match.group(2))


def _busy(listed: Listed, rest: str) -> None:
    """A pid (at most 10 digits) running on the venv or a GPU, or a probe that could not
    answer; anything else is dropped."""
    kind, _, pid = rest.partition(" ")
    if kind in ("venv", "gpu") and pid.isdigit() and len(pid) <= 10:
        listed.busy[kind].append(int(pid))
    elif kind == "unknown" and pid in ("venv", "gpu"):
        listed.busy[kind].append(pid)


_TAGGED: Mapping[str, Callable[[Listed, str], None]] = MappingProxyType(
    {
        "deb": _deb,
        "rpm": _rpm,
        "lock": _lock,
        "scl": _toolset,
        "pkg": _venv_package,
        "busy": _busy,
    }
)


def listed_lines(lines: list[str]) -> Listed:
    listed = Listed()
    for line in lines:
        tag, _, rest = line.partition(" ")
        if tag in _TAGGED:
            _TAGGED[tag](listed, rest)
        elif tag.startswith("torch"):
            listed.torch[tag] = rest.strip()
        else:
            listed.head[tag] = rest.strip()
    return listed


def installed_and_held(os_: OsFamilyT, listed: Listed) -> tuple[dict[str, str], list[str]]:
    """The stack's packages and those held, by the node's own package manager: rpm and the
    versionlock list (its stack entries only) on RHEL-family, dpkg elsewhere."""
    if os_["family"] == "rhel":
        return listed.rpm, sorted({n for n in listed.locks if _STACK_NAME.match(n)})
    return listed.deb, sorted(listed.deb_held)


def nvcc_info(line: str | None) -> NvccT | None:
    """``/usr/local/cuda/bin/nvcc Cuda compilation tools, release 12.4, V12.4.131``."""
    path, _, release_line = (line or "").partition(" ")
    match = _NVCC.search(release_line)
    if not match:
        return None
    return {"path": path, "release": match.group(1), "version": match.group(2)}


def torch_info(torch: dict[str, str]) -> TorchT | None:
    """What the venv's torch reported (``torch_*`` lines); CUDA values only with a GPU."""
    if "torch" not in torch:
        return None
    cudnn = _none(torch.get("torch_cudnn", ""))
    return {
        "version": torch["torch"],
        "cuda": _none(torch.get("torch_cuda", "")),
        "gpu": torch.get("torch_gpu") == "True",
        "cudnn": int(cudnn) if cudnn and cudnn.isdigit() else None,
        "nccl": _none(torch.get("torch_nccl", "")),
    }


def file_text(lines: list[str]) -> str:
    """A file the script printed (``awk 1``: each line ends in a newline) as its text."""
    return "\n".join(lines) + "\n"


class StackVersions(FactBase[StackVersionsT]):
    """
    The software stack as installed and loaded, in one command: OS family, the installed CUDA
    toolkit / cuDNN / NCCL packages (dpkg-query or rpm) and which are held (``apt-mark hold``,
    read from dpkg's selection state) or version-locked (the dnf/yum versionlock list files, read
    directly: ``dnf versionlock list`` loads every repo), the CUDA apt keyring and repo files,
    ``nvcc --version`` (PATH, then /usr/local/cuda/bin), every package in the venv and what the
    venv's torch reports, and gcc: the active one, /usr/bin/gcc, each /opt/rh toolset's, and
    trainfleet's profile.d file that enables a toolset; and what runs on the stack now: the
    processes that map a file of the venv and the GPUs' processes (their pids). Absent tools
    are None, never errors.

    + venv: the node venv whose python is asked for torch

    .. code:: python

        {
            "os": {"id": "ubuntu", "family": "debian", "version": "22.04",
                   "package_manager": "apt"},
            "packages": {"cuda-toolkit-12-4": "12.4.1-1", "libnccl2": "2.21.5-1+cuda12.4"},
            "held": ["libnccl2"],
            "keyring": True,
            "repos": {"/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list": "deb [...] ... /\\n"},
            "nvcc": {"path": "/usr/local/cuda/bin/nvcc", "release": "12.4", "version": "12.4.131"},
            "venv": True,
            "venv_packages": {"filelock": "3.13.1", "torch": "2.4.1+cu124", ...},
            "torch": {"version": "2.4.1+cu124", "cuda": "12.4", "gpu": True, "cudnn": 90100,
                      "nccl": "2.20.5"},
            "gcc": {"line": "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0", "version": "11.4.0",
                    "major": 11},
            "system_gcc": {"line": "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0",
                           "version": "11.4.0", "major": 11},
            "toolsets": {},
            "gcc_profile": None,
            "busy": {"venv": [], "gpu": [], "unknown": []},
        }
    """

    def command(self, venv: str) -> StringCommand:
        return shell(_SCRIPT, venv, _SECTION, GCC_PROFILE, _PY)

    def process(self, output: list[str]) -> StackVersionsT:
        before, sections = split_sections(output, _SECTION)  # file sections come last
        listed = listed_lines(before)
        files = {path: lines or [] for path, lines in sections.items()}
        profile = files.pop(GCC_PROFILE, None)
        os_ = os_release(listed.head)
        packages, held = installed_and_held(os_, listed)
        head = listed.head
        return {
            "os": os_,
            "packages": dict(sorted(packages.items())),
            "held": held,
            "keyring": head.get("keyring") == "yes",
            "repos": {path: file_text(lines) for path, lines in sorted(files.items())},
            "nvcc": nvcc_info(head.get("nvcc")),
            "venv": head.get("venv") == "yes",
            "venv_packages": dict(sorted(listed.venv_packages.items())),
            "torch": torch_info(listed.torch),
            "gcc": gcc_info(head.get("gcc", "")),
            "system_gcc": gcc_info(head.get("sysgcc", "")),
            "toolsets": listed.toolsets,
            "gcc_profile": None if profile is None else file_text(profile),
            "busy": {kind: sorted(set(pids)) for kind, pids in listed.busy.items()},
        }

    @staticmethod
    def default() -> StackVersionsT:
        """No output at all (the script always prints the OS): everything absent."""
        return StackVersions().process([])

    def answer(self, value: dict, recorded: list[str]) -> list[str]:
        """What the script prints on the node ``recorded`` holds once its stack is ``value``'s
        (each key ``value`` leaves out is the recorded one; ``nvcc`` and ``torch`` may name
        only some of their fields): the recorded lines of each part that is unchanged, the
        others printed as the script prints them; the files' sections last, as the script's."""
        import typing  # only the benchmark's answer needs it, not the fact's run on a node

        old: dict[str, typing.Any] = dict(self.process(recorded))
        new = {**old, **value}
        for key in ("nvcc", "torch"):
            if isinstance(old[key], dict) and isinstance(value.get(key), dict):
                new[key] = {**old[key], **value[key]}
        head, sections = split_sections(recorded, _SECTION)
        rhel = new["os"]["family"] == "rhel"

        def gcc(tag: str, info: GccT | None) -> list[str]:
            return [f"{tag} {info['line']}"] if info else []

        def nvcc(info: dict[str, str] | None) -> list[str]:
            if not info:
                return []
            release = info["release"]
            version = info.get("version") or f"{release}.0"
            path = info.get("path") or "/usr/local/cuda/bin/nvcc"
            return [f"nvcc {path} Cuda compilation tools, release {release}, V{version}"]

        def torch(info: dict[str, typing.Any] | None) -> list[str]:
            if not info:
                return []
            fields = ("cuda", "gpu", "cudnn", "nccl")
            return [f"torch {info['version']}"] + [
                f"torch_{key} {info.get(key)}" for key in fields if key == "gpu" or info.get(key)
            ]

        def packages(state: dict[str, typing.Any]) -> list[str]:
            items = state["packages"].items()
            if rhel:  # a lock entry as dnf writes it: NAME-EPOCH:VERSION-RELEASE.*
                versions = {n: state["packages"].get(n, "0") for n in state["held"]}
                return [f"rpm {n} {v}" for n, v in items] + [
                    f"lock {n}-0:{v if '-' in v else v + '-0'}.*" for n, v in versions.items()
                ]
            return [
                f"deb {'hold' if n in state['held'] else 'install'} ok installed {n} {v}"
                for n, v in items
            ]

        parts: tuple[tuple[tuple[str, ...], tuple[str, ...], typing.Any], ...] = (
            (
                ("os",),
                ("id", "like", "version"),
                lambda s: [
                    f"id {s['os']['id']}",
                    f"like {'' if s['os']['family'] == s['os']['id'] else s['os']['family']}",
                    f"version {s['os']['version']}",
                ],
            ),
            (("packages", "held"), ("deb", "rpm", "lock"), packages),
            (("keyring",), ("keyring",), lambda s: ["keyring yes"] if s["keyring"] else []),
            (("nvcc",), ("nvcc",), lambda s: nvcc(s["nvcc"])),
            (
                ("busy",),
                ("busy",),
                lambda s: [
                    f"busy {kind} {pid}" for kind, pids in s["busy"].items() for pid in pids
                ],
            ),
            (("venv",), ("venv",), lambda s: ["venv yes"] if s["venv"] else []),
            (
                ("venv_packages",),
                ("pkg",),
                lambda s: [f"pkg {n} {v}" for n, v in s["venv_packages"].items()],
            ),
            (
                ("torch",),
                ("torch", "torch_cuda", "torch_gpu", "torch_cudnn", "torch_nccl"),
                lambda s: torch(s["torch"]),
            ),
            (("gcc",), ("gcc",), lambda s: gcc("gcc", s["gcc"])),
            (("system_gcc",), ("sysgcc",), lambda s: gcc("sysgcc", s["system_gcc"])),
            (
                ("toolsets",),
                ("scl",),
                lambda s: [
                    line
                    for name, info in s["toolsets"].items()
                    for line in gcc(f"scl {name}", info)
                ],
            ),
        )
        lines: list[str] = []
        for keys, tags, render in parts:
            if all(old[key] == new[key] for key in keys):
                lines += [line for line in head if line.partition(" ")[0] in tags]
            else:
                lines += render(new)
        files = dict(new["repos"])
        if new["gcc_profile"] is not None:
            files[GCC_PROFILE] = new["gcc_profile"]
        if (old["repos"], old["gcc_profile"]) == (new["repos"], new["gcc_profile"]):
            return lines + [
                line for path, body in sections.items() for line in [f"{_SECTION} {path}", *body]
            ]
        for path, text in files.items():
            lines += [f"{_SECTION} {path}", *text.removesuffix("\n").split("\n")]
        return lines
