"""The pinned software stack: CUDA repo, exact CUDA/cuDNN/NCCL/OpenMPI packages (held), gcc,
torch venv.

Each operation reads the StackVersions fact once and yields only what must change. The values
come from the node's plan (``trainfleet.plan.StackPlan``: packages resolved for its OS family,
the torch build, repository settings), never from the spec; packages are installed and held by
operations/packages_ops.py. Pure builders (``cuda_distro``, ...) turn values into commands.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

from pyinfra import host, logger
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from facts.shell import shell
from facts.stack_facts import BUSY_PROBE, CUDA_KEYRING, GCC_PROFILE, StackVersions, StackVersionsT
from operations.packages_ops import APT, held, or_fail, rpm_ensure
from operations.remote import FailCommand, fail_command, script, write_file_command
from runtime.gather import fact, lent
from trainfleet.defaults import CUDA_KEYRING_DEB, CUDA_KEYRING_FINGERPRINT, CUDA_REPOS, VENV_DIR
from trainfleet.osfamily import OsFamilyT
from trainfleet.pins import Pins, satisfies, torch_requirement
from trainfleet.plan import StackPlan
from trainfleet.schema import fingerprint_problem, url_problem

NVIDIA_REPOS = CUDA_REPOS
KEYRING_DEB = CUDA_KEYRING_DEB
RPM_GPG_KEY = "D42D0685.pub"  # NVIDIA's RPM repo key since the 2022 rotation
TORCH_INDEX = "https://download.pytorch.org/whl"

# Fetch the keyring .deb ($1, over the scheme $3 only, redirects included where curl does it),
# check that the keyring inside holds exactly one key, fingerprint $2, and only then dpkg -i it.
# mktemp -d: a fresh 0700 directory of root's under an unguessable name, so no other user can
# place, swap or read the file between the download, the check and the install.
_KEYRING = script("stack_cuda_keyring.sh")


def _fact(venv: str = VENV_DIR) -> StackVersionsT:
    # ``software`` lends the fact it read to the operations it composes (gather.lent):
    # StackVersions imports torch on the node (seconds), so once is enough.
    return fact(StackVersions, venv=venv)


def _unsupported(os_: OsFamilyT, what: str) -> StringCommand:
    return fail_command(f"{what}: unsupported OS {os_['id']!r} (Debian/Ubuntu and RHEL-family are)")


# ---- (a) CUDA repository ------------------------------------------------------------------


def cuda_distro(os_: OsFamilyT) -> str | None:
    """NVIDIA's repo directory for an OS: ubuntu2204, debian12, rhel9, rhel7, fedora39."""
    major = os_["version"].split(".")[0]
    if os_["id"] == "ubuntu":
        return "ubuntu" + os_["version"].replace(".", "")
    if os_["id"] == "debian":
        return "debian" + major
    if os_["id"] == "fedora":
        return "fedora" + major
    if os_["family"] == "rhel" and major:
        return "rhel" + major
    return None


def apt_source(base: str) -> str:
    return f"deb [signed-by={CUDA_KEYRING}] {base}/ /\n"


def yum_repo(distro: str, arch: str, base: str) -> str:
    return (
        f"[cuda-{distro}-{arch}]\nname=cuda-{distro}-{arch}\nbaseurl={base}\n"
        f"enabled=1\ngpgcheck=1\ngpgkey={base}/{RPM_GPG_KEY}\n"
    )


def mirror_problem(mirror: str, insecure: bool = False) -> str | None:
    """Why the repos root ``mirror`` may not be used: the spec's URL grammar (https, or file://
    on the node), and http only with ``insecure`` (the spec's ``stack.insecure: true``).
    Checked here too because an operation can be called without a spec."""
    if urlsplit(mirror).scheme not in ("https", "http", "file"):
        return f"{mirror} is not an https:// (or file://) URL"
    if problem := url_problem(mirror, file_ok=True):
        return problem
    if mirror.startswith("http://") and not insecure:
        return (
            f"{mirror} is plain http: the CUDA keyring and repository are fetched over https only "
            "(set stack.insecure: true to allow this mirror)"
        )
    return None


def keyring_install(url: str, fingerprint: str) -> StringCommand:
    """Download the keyring .deb from ``url``, check its key, install it (``_KEYRING``)."""
    return shell(_KEYRING, url, fingerprint, urlsplit(url).scheme)


@operation()
def cuda_repo(
    mirror: str = NVIDIA_REPOS,
    distro: str | None = None,
    arch: str = "x86_64",
    insecure: bool = False,
    keyring_fingerprint: str = CUDA_KEYRING_FINGERPRINT,
):
    """
    Configure NVIDIA's CUDA package repository (apt: keyring package + sources list;
    RHEL: .repo file).

    + mirror: the repos root, ``<mirror>/<distro>/<arch>/`` is the repo, e.g.
      ``"https://mirror.example.com/nvidia/cuda/repos"`` (default: developer.download.nvidia.com);
      https, or ``file://`` for a copy on the node
    + distro: NVIDIA's name for the OS, e.g. ``"ubuntu2204"`` or ``"rhel9"``;
      default from /etc/os-release
    + arch: ``"x86_64"`` or ``"sbsa"`` (Arm servers)
    + insecure: ``True`` allows an ``http://`` mirror (the spec's ``stack.insecure``)
    + keyring_fingerprint: the one key the ``cuda-keyring`` .deb may hold (checked before
      ``dpkg -i``); default NVIDIA's, ``trainfleet.defaults.CUDA_KEYRING_FINGERPRINT``

    The apt list is ``/etc/apt/sources.list.d/cuda-<distro>-<arch>.list``, the file the
    ``cuda-keyring`` package itself writes, so the official URL converges with no change.
    The .repo file keeps ``gpgcheck=1``; its ``gpgkey`` is under the mirror (https unless insecure).

    **Example:**

    .. code:: python

        stack.cuda_repo(name="CUDA repository", mirror="https://mirror.example.com/nvidia/cuda/repos")
    """
    problem = mirror_problem(mirror, insecure) or fingerprint_problem(keyring_fingerprint)
    if problem:
        yield fail_command(f"cuda_repo: {problem}")
        return
    current = _fact()
    os_ = current["os"]
    distro = distro or cuda_distro(os_)
    if os_["package_manager"] is None:
        yield _unsupported(os_, "cuda_repo")
        return
    if distro is None:
        yield fail_command(
            f"cuda_repo: no NVIDIA repo name for {os_['id']} {os_['version']}: "
            "pass distro=, e.g. 'ubuntu2204'"
        )
        return
    base = f"{mirror.rstrip('/')}/{distro}/{arch}"
    commands: list[StringCommand] = []
    if os_["family"] == "debian":
        path = f"/etc/apt/sources.list.d/cuda-{distro}-{arch}.list"
        if not current["keyring"]:
            commands.append(keyring_install(f"{base}/{KEYRING_DEB}", keyring_fingerprint))
        if current["repos"].get(path) != apt_source(base):
            commands.append(write_file_command(path, apt_source(base)))
        if commands:
            commands.append(StringCommand(APT, "update", "-q"))
    else:
        path = f"/etc/yum.repos.d/cuda-{distro}.repo"
        if current["repos"].get(path) != yum_repo(distro, arch, base):
            commands.append(write_file_command(path, yum_repo(distro, arch, base)))
    if not commands:
        host.noop(f"CUDA repository {base} is configured")
        return
    yield from commands


# ---- (b) exact packages, held -------------------------------------------------------------


@operation()
def packages(pins: Pins, allow_change: bool = False, problems: Collection[str] = ()):
    """
    Install the CUDA toolkit, cuDNN, NCCL, OpenMPI and the NVIDIA driver at exactly the plan's
    versions, and hold them (``apt-mark hold`` on Debian/Ubuntu, ``dnf``/``yum versionlock add``
    on RHEL-family), with operations/packages_ops.py's ``held``.

    + pins: package name -> exact version (None: any, held), as the plan resolved the spec's
      ``stack`` for the node's OS family (``StackPlan.packages``, ``trainfleet.pins.package_pins``),
      e.g. ``{"cuda-toolkit-12-4": None, "libnccl2": "2.21.5-1+cuda12.4"}``
    + allow_change: ``True`` lets a node that has a DIFFERENT version installed be moved to
      the pin (held packages are released and re-held). Without it such a node fails with a
      message naming each package, and nothing on it changes.
    + problems: why the plan could not resolve the pins (``StackPlan.problems``): the node fails

    **Example:**

    .. code:: python

        stack.packages(name="CUDA, cuDNN, NCCL pinned", pins=plan.stack.packages)
    """
    current = _fact()
    os_ = current["os"]
    if os_["package_manager"] is not None and problems:
        yield fail_command("packages: " + "; ".join(problems))
        return
    yield from held._inner(
        packages=pins,
        installed=current["packages"],
        held_now=current["held"],
        os_=os_,
        allow_change=allow_change,
    )


# ---- (c) gcc ------------------------------------------------------------------------------


def toolset_name(os_: OsFamilyT, major: int) -> str:
    """``devtoolset-N`` on EL7 (Software Collections), ``gcc-toolset-N`` on EL8/9."""
    return f"devtoolset-{major}" if os_["package_manager"] == "yum" else f"gcc-toolset-{major}"


def gcc_profile(toolset: str) -> str:
    enable = f"/opt/rh/{toolset}/enable"
    return (
        f"# Written by trainfleet: login shells use {toolset}'s gcc.\n"
        f"if [ -r {enable} ]; then . {enable}; fi\n"
    )


def toolset_install(os_: OsFamilyT, toolset: str) -> StringCommand:
    """Install a gcc toolset; CentOS 7 first enables Software Collections (centos-release-scl)."""
    parts = [f"{toolset}-gcc", f"{toolset}-gcc-c++"]
    manager = os_["package_manager"]
    if manager == "yum":
        parts.append(f"{toolset}-binutils")
        if os_["id"] == "centos":
            return StringCommand(
                *rpm_ensure("yum", "centos-release-scl"),
                "&&",
                "yum",
                "install",
                "-y",
                *(QuoteString(p) for p in parts),
            )
    return StringCommand(str(manager), "install", "-y", *(QuoteString(p) for p in parts))


@operation()
def gcc(major: str | int):
    """
    Make gcc ``major`` the compiler: Debian/Ubuntu ``gcc-N`` selected with update-alternatives;
    RHEL 8/9 ``gcc-toolset-N``, CentOS/RHEL 7 ``devtoolset-N``, each enabled for login shells
    from ``/etc/profile.d/trainfleet-gcc.sh``. A system gcc of that major needs nothing.

    + major: the GCC major version, e.g. ``"11"`` (the spec's ``stack.gcc``)

    **Example:**

    .. code:: python

        stack.gcc(name="gcc 11", major=cluster.stack["gcc"])
    """
    if not re.fullmatch(r"\d{1,2}", str(major)):
        raise OperationValueError(f"gcc: {major!r} is not a GCC major version (e.g. '11')")
    n = int(major)
    current = _fact()
    os_ = current["os"]
    system = (current["system_gcc"] or {}).get("major")  # not PATH: a sourced toolset would mask it
    if os_["family"] == "debian":
        if system == n:
            host.noop(f"gcc {n} is /usr/bin/gcc")
            return
        yield StringCommand(APT, "install", "-y", "-q", f"gcc-{n}", f"g++-{n}")
        yield StringCommand(
            "update-alternatives",
            "--install",
            "/usr/bin/gcc",
            "gcc",
            f"/usr/bin/gcc-{n}",
            str(n * 10),
            "--slave",
            "/usr/bin/g++",
            "g++",
            f"/usr/bin/g++-{n}",
        )
        yield StringCommand("update-alternatives", "--set", "gcc", f"/usr/bin/gcc-{n}")
        return
    if os_["family"] != "rhel":
        yield _unsupported(os_, "gcc")
        return
    if system == n:  # the distribution's own gcc: no toolset, no profile
        if current["gcc_profile"] is None:
            host.noop(f"gcc {n} is the system gcc")
            return
        yield StringCommand("rm", "-f", GCC_PROFILE)
        return
    toolset = toolset_name(os_, n)
    commands = []
    if (current["toolsets"].get(toolset) or {}).get("major") != n:
        commands.append(toolset_install(os_, toolset))
    if current["gcc_profile"] != gcc_profile(toolset):
        commands.append(write_file_command(GCC_PROFILE, gcc_profile(toolset)))
    if not commands:
        host.noop(f"gcc {n} from {toolset} is enabled for login shells")
        return
    yield from commands


# ---- (d) torch venv -----------------------------------------------------------------------


@operation()
def torch_venv(
    venv: str,
    torch_version: str,
    variant: str,
    index_url: str | None = None,
    wheelhouse: str | None = None,
    python: str = "python3",
    allow_change: bool = False,
):
    """
    Create the node venv and install exactly ``torch==<version>+<variant>`` in it.

    + venv: the venv directory, e.g. ``"/opt/trainfleet/venv"`` (``trainfleet.defaults.VENV_DIR``)
    + torch_version: e.g. ``"2.4.1"`` (``"2.4.1+cu124"`` is taken as is)
    + variant: the CUDA variant of the wheel index, e.g. ``"cu124"`` or ``"cpu"``
    + index_url: a mirror of the variant's index; default ``https://download.pytorch.org/whl/<variant>``
    + wheelhouse: for air-gapped clusters, a directory on the node holding the wheels, e.g.
      ``"/srv/wheels"``: installs with ``--no-index --find-links``. Excludes ``index_url``.
    + python: the interpreter that creates the venv, e.g. ``"python3.11"``

    Nothing happens when the venv's torch already reports exactly that version.

    **Example:**

    .. code:: python

        stack.torch_venv(name="torch venv", venv=VENV_DIR, torch_version="2.4.1", variant="cu124")
    """
    if index_url and wheelhouse:
        raise OperationValueError("torch_venv: give index_url or wheelhouse, not both")
    requirement = torch_requirement(torch_version, variant)
    current = _fact(venv)
    have = (current["torch"] or {}).get("version")
    if current["venv"] and have == requirement.split("==", 1)[1]:
        host.noop(f"torch {have} is installed in {venv}")
        return
    if have and not allow_change:
        yield fail_command(
            f"torch_venv: {venv} has torch {have}, the pin is {requirement.split('==', 1)[1]}; "
            "not replacing it (set stack.allow_change to replace)"
        )
        return
    if not current["venv"]:
        yield StringCommand(
            QuoteString(python),
            "-m",
            "venv",
            QuoteString(venv),
            *or_fail(f"torch_venv: {python} -m venv failed (is python3-venv installed?)"),
        )
    if wheelhouse:
        source = ["--no-index", "--find-links", QuoteString(wheelhouse)]
    else:
        source = ["--index-url", QuoteString(index_url or f"{TORCH_INDEX}/{variant}")]
    yield StringCommand(
        QuoteString(f"{venv}/bin/python"),
        "-m",
        "pip",
        "install",
        "--no-input",
        QuoteString(requirement),
        *source,
    )


@operation()
def python_packages(
    venv: str,
    packages: Mapping[str, str],
    keep: str | None = None,
    wheelhouse: str | None = None,
    allow_change: bool = False,
    no_deps: Collection[str] = (),
):
    """
    Install Python packages in the node venv at exactly the given versions.

    + venv: the node venv (made by ``torch_venv``), e.g. ``"/opt/trainfleet/venv"``
    + packages: PEP 503 name -> exact version,
      e.g. ``{"accelerate": "1.15.0", "deepspeed": "0.19.8"}``
    + keep: ``torch==<build>``, given to pip beside them so that no package's
      requirement can move torch
    + wheelhouse: a directory on the node holding the wheels (``--no-index --find-links``);
      None: the node's pip index (PyPI, or its pip.conf mirror)
    + allow_change: replace a package installed at another version; without it the node fails
      with every such package named, and nothing changes
    + no_deps: packages installed without their requirements (``pip install --no-deps``), after
      the others: ColossalAI 0.5.0 requires torch<=2.5.1, yet its runner works beside a newer one

    **Example:**

    .. code:: python

        stack.python_packages(name="venv packages", venv=VENV_DIR, packages={"deepspeed": "0.19.8"})
    """
    current = _fact(venv)
    have = current["venv_packages"]
    missing = {name: version for name, version in packages.items() if name not in have}
    changes = {
        name: version
        for name, version in packages.items()
        if name in have and not satisfies(have[name], version)
    }
    if changes and not allow_change:
        yield fail_command(
            "python_packages: not changing installed versions (set stack.allow_change to replace): "
            + "; ".join(
                f"{name} is {have[name]} in {venv}, the pin is {version}"
                for name, version in changes.items()
            )
        )
        return
    wanted = {**missing, **changes}
    if not wanted:
        host.noop(
            f"{venv} has "
            + (", ".join(f"{n} {v}" for n, v in packages.items()) or "no other pinned package")
        )
        return
    source = ["--no-index", "--find-links", QuoteString(wheelhouse)] if wheelhouse else []
    keep_torch = [QuoteString(keep)] if keep else []
    pip = [QuoteString(f"{venv}/bin/python"), "-m", "pip", "install", "--no-input"]
    resolved = {name: version for name, version in sorted(wanted.items()) if name not in no_deps}
    alone = {name: version for name, version in sorted(wanted.items()) if name in no_deps}
    if resolved:
        yield StringCommand(
            *pip,
            *(QuoteString(f"{name}=={version}") for name, version in resolved.items()),
            *keep_torch,
            *source,
        )
    if alone:
        yield StringCommand(
            *pip,
            "--no-deps",
            *(QuoteString(f"{name}=={version}") for name, version in alone.items()),
            *source,
        )


# ---- the whole stack, reading the fact once ----------------------------------------------


# The components whose packages come from NVIDIA's CUDA repository, and all packaged ones.
FROM_CUDA_REPO = frozenset({"cuda", "cudnn", "nccl", "driver"})
PACKAGED = FROM_CUDA_REPO | {"openmpi"}


@operation()
def software(stack: StackPlan, venv: str = VENV_DIR):
    """
    The node's whole stack plan: CUDA repository, CUDA/cuDNN/NCCL/OpenMPI packages (exact,
    held), gcc and the torch venv with its other pinned Python packages, each only where the
    spec pins it, from ONE StackVersions fact.

    + stack: the node's ``StackPlan`` (trainfleet/plan.py): resolved packages, torch build,
      venv packages, repository settings, gcc, ``allow_change``
    + venv: the node venv

    **Example:**

    .. code:: python

        stack.software(name="Pinned software stack", stack=plan.stack)
    """
    if not stack.pinned:
        host.noop("no stack component is pinned")
        return
    # (what a running job loads, to name when held back: packages, the venv; "" otherwise), cmds
    parts: list[tuple[str, list]] = []
    current = fact(StackVersions, venv=venv)
    # Lent under the venv the torch part asks with and the default the package parts ask with.
    with lent(StackVersions, current, venv=venv), lent(StackVersions, current, venv=VENV_DIR):
        if not FROM_CUDA_REPO.isdisjoint(stack.pinned):
            repo = cuda_repo._inner(
                mirror=stack.cuda_repo,
                insecure=stack.insecure,
                keyring_fingerprint=stack.keyring_fingerprint,
            )
            parts.append(("", list(repo)))
        if not PACKAGED.isdisjoint(stack.pinned):
            pinned = packages._inner(
                pins=stack.packages, allow_change=stack.allow_change, problems=stack.problems
            )
            parts.append((f"packages {', '.join(sorted(stack.packages))}", list(pinned)))
        if stack.gcc:
            parts.append(("", list(gcc._inner(major=stack.gcc))))
        if stack.torch:
            venv_torch = torch_venv._inner(
                venv=venv,
                torch_version=stack.torch,
                variant=stack.torch_variant,
                index_url=stack.torch_index,
                wheelhouse=stack.wheelhouse,
                allow_change=stack.allow_change,
            )
            parts.append((f"torch {stack.torch} in {venv}", list(venv_torch)))
            if stack.python:
                beside = python_packages._inner(
                    venv=venv,
                    packages=stack.python,
                    no_deps=stack.no_deps,
                    keep=torch_requirement(stack.torch, stack.torch_variant),
                    wheelhouse=stack.wheelhouse,
                    allow_change=stack.allow_change,
                )
                parts.append((f"{', '.join(sorted(stack.python))} in {venv}", list(beside)))
    refusals = [c for _, cs in parts for c in cs if isinstance(c, FailCommand)]
    if refusals:  # a refused part fails the node before anything else on it changes
        yield refusals[0]
        return
    held = [what for what, cs in parts if what and cs]
    hold = held_under_a_job(current, held)
    commands = [c for what, cs in parts if not (hold and what) for c in cs]
    if held and not hold and host.data.get(BUSY_OK) not in (True, 1):
        # a job may have started since the fact was read: probed again, first
        commands.insert(0, busy_guard(venv))
    if not commands:
        host.noop(
            f"held back under a running job: {'; '.join(held)}"
            if hold
            else "the pinned stack is in place"
        )
        return
    yield from commands


# ---- a running job: its stack is not changed under it -------------------------------------

BUSY_OK = "trainfleet_change_busy_stack"  # --data trainfleet_change_busy_stack=1: change anyway


def busy(current: StackVersionsT) -> str:
    """The processes running on the node's stack, for people ("" when none): from the venv (a
    file of it mapped) and on the GPUs; a probe that could not answer counts too."""
    running = current.get("busy") or {}
    parts = [
        f"{what} {', '.join(str(pid) for pid in (running.get(kind) or [])[:8])}"
        for kind, what in (("venv", "pids from the venv:"), ("gpu", "GPU pids:"))
        if running.get(kind)
    ]
    parts += [
        f"the {kind} probe could not answer, so a job there cannot be ruled out"
        for kind in running.get("unknown") or []
    ]
    return "; ".join(parts)


_GUARD = BUSY_PROBE + script("stack_busy_guard.sh")


def busy_guard(venv: str) -> StringCommand:
    """A command that fails, naming the pids, where a job now runs on the venv or the GPUs (or
    the probe cannot tell): the stack's changes after it are not made."""
    return shell(_GUARD, venv)


def held_under_a_job(current: StackVersionsT, changes: list[str]) -> bool:
    """Whether ``changes`` (to what a running job loads, for people) are held back on this node:
    a job runs there (``busy``) and this run was not told to change it anyway. Either way the
    node, the job and the changes are named."""
    running = busy(current)
    if not (changes and running):
        return False
    anyway = host.data.get(BUSY_OK) in (True, 1)
    logger.warning(
        f"{host.print_prefix}"
        + ("changing" if anyway else "not changing")
        + f" the stack under a running job ({running}): {'; '.join(changes)}"
        + ("" if anyway else f"; rerun when it ends, or with --data {BUSY_OK}=1")
    )
    return not anyway
