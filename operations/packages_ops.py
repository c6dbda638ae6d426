"""The one way trainfleet installs system packages: exactly the plan's versions, held.

Debian/Ubuntu: ``apt-get install name=version`` then ``apt-mark hold``; RHEL-family:
``dnf``/``yum install name-version`` (``rpm -q`` proves the versions landed) then
``versionlock add``. ``package_change`` decides what must change from what the node has;
``install_held`` builds the commands; the ``held`` operation does both (noop when already so).
Used by operations/stack_ops.py (CUDA, cuDNN, NCCL, OpenMPI, the driver),
operations/gpu_node_ops.py (the fabric manager) and operations/pdsh_ops.py (``install_any``:
pdsh, any version, not held).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from operations.remote import fail_command
from trainfleet.osfamily import OsFamilyT

APT = "DEBIAN_FRONTEND=noninteractive apt-get"
VERSIONLOCK = MappingProxyType(
    {"dnf": "python3-dnf-plugin-versionlock", "yum": "yum-plugin-versionlock"}
)


def or_fail(message: str) -> list[str | QuoteString]:
    """Shell words: when the command before fails, fail with ``message`` on stderr."""
    return ["||", "{", "echo", QuoteString(f"trainfleet: {message}"), ">&2;", "exit", "1;", "}"]


def rpm_ensure(manager: str, package: str) -> list[str]:
    """Shell words: install ``package`` unless rpm already has it."""
    return ["(", "rpm", "-q", package, ">/dev/null", "2>&1", "||", manager, "install", "-y"] + [
        package,
        ")",
    ]


def install_any(
    os_: OsFamilyT, apt: list[str], rpm: list[str], epel: str | None = None
) -> StringCommand:
    """Install packages at any version, not held: ``apt`` names on Debian/Ubuntu (the package
    lists are updated only when the install cannot find them: a fresh image may have none),
    ``rpm`` names on RHEL-family; ``epel``: they come from EPEL (``epel-release`` first), and
    a failure says so, naming ``epel``."""
    manager = str(os_["package_manager"])
    if os_["family"] == "debian":
        install = f"{APT} install -y -q {' '.join(apt)}"
        return StringCommand(f"{install} || {{ apt-get update -q && {install}; }}")
    words = [manager, "install", "-y", *rpm]
    if epel is None:
        return StringCommand(*words)
    return StringCommand(
        f"(rpm -q epel-release >/dev/null 2>&1 || {manager} install -y epel-release) &&",
        *words,
        *or_fail(f"{epel} comes from EPEL: enable EPEL and re-run"),
    )


def package_spec(family: str, name: str, version: str | None) -> QuoteString:
    """``name=version`` (apt) or ``name-version`` (dnf/yum); the bare name for any version."""
    if version is None:
        return QuoteString(name)
    return QuoteString(f"{name}={version}" if family == "debian" else f"{name}-{version}")


@dataclass(frozen=True)
class PackageChange:
    install: list[str]  # names to install at their pins (missing, or at another version)
    changes: dict[str, str]  # name -> the installed version that is not its pin
    hold: list[str]  # names to hold (not held yet, or installed anew)
    unlock: list[str]  # held names installed anew (dnf/yum: their version lock goes first)


def package_change(
    wanted: Mapping[str, str | None],
    installed: Mapping[str, str],
    held: Collection[str],
    same: Callable[[str, str], bool] = operator.eq,
) -> PackageChange:
    """What must change for ``wanted`` (name -> exact version; None: any) to be installed
    and held. ``same(installed, pin)``: whether an installed version is the pin."""
    install, changes = [], {}
    for name, version in wanted.items():
        have = installed.get(name)
        if have is None:
            install.append(name)
        elif version is not None and not same(have, version):
            changes[name] = have
            install.append(name)
    hold = [name for name in wanted if name not in held or name in install]
    unlock = [name for name in install if name in held]
    return PackageChange(install=install, changes=changes, hold=hold, unlock=unlock)


def install_held(
    os_: OsFamilyT,
    wanted: Mapping[str, str | None],
    change: PackageChange,
    failure: str,
    replacing: bool = False,
    lock_plugin: bool = True,
) -> list[StringCommand]:
    """The commands that install ``change.install`` at exactly their pins and hold
    ``change.hold``.

    + failure: the message when rpm does not find the exact versions after the install
    + replacing: installed versions are moved (apt may downgrade and change held packages)
    + lock_plugin: install the versionlock plugin first where it is missing (dnf/yum)
    """
    family, manager = os_["family"], str(os_["package_manager"])
    specs = [package_spec(family, name, wanted[name]) for name in change.install]
    commands: list[StringCommand] = []
    if family == "debian":
        if specs:
            flags = ["--allow-downgrades", "--allow-change-held-packages"] if replacing else []
            commands.append(
                StringCommand(APT, "update", "-q", "&&", APT, "install", "-y", "-q", *flags, *specs)
            )
        if change.hold:
            commands.append(
                StringCommand("apt-mark", "hold", *(QuoteString(name) for name in change.hold))
            )
        return commands
    if change.unlock:  # a locked version would refuse the new one
        unlock = (QuoteString(name) for name in change.unlock)
        commands.append(StringCommand(manager, "versionlock", "delete", *unlock))
    if specs:
        # rpm -q proves the exact versions landed (EL7's yum install does not downgrade)
        commands.append(
            StringCommand(
                manager,
                "install",
                "-y",
                *specs,
                "&&",
                "rpm",
                "-q",
                *specs,
                ">/dev/null",
                *or_fail(failure),
            )
        )
    if change.hold:
        ensure = [*rpm_ensure(manager, VERSIONLOCK[manager]), "&&"] if lock_plugin else []
        lock = [package_spec(family, name, wanted[name]) for name in change.hold]
        commands.append(StringCommand(*ensure, manager, "versionlock", "add", *lock))
    return commands


@operation()
def held(
    packages: Mapping[str, str | None],
    installed: Mapping[str, str],
    held_now: Collection[str],
    os_: OsFamilyT,
    allow_change: bool = False,
    what: str = "packages",
):
    """
    Install ``packages`` at exactly their versions and hold them; noop when already so.

    + packages: name -> exact version (None: any version, still held), as the plan resolved
      them for the node's OS family, e.g. ``{"libnccl2": "2.21.5-1+cuda12.4"}``
    + installed: name -> the version the node has (its fact)
    + held_now: the names the node holds (``apt-mark hold``, versionlock)
    + os_: the node's OS family (``trainfleet.osfamily.OsFamilyT``)
    + allow_change: move a package installed at another version to its pin; without it
      the node fails with each such package named, and nothing changes
    + what: names the part in messages
    """
    if os_["package_manager"] is None:
        yield fail_command(
            f"{what}: unsupported OS {os_['id']!r} (Debian/Ubuntu and RHEL-family are)"
        )
        return
    change = package_change(packages, installed, held_now)
    if change.changes and not allow_change:
        yield fail_command(
            f"{what}: not changing installed versions (pass allow_change=True to replace): "
            + "; ".join(
                f"{name} is {have} here, the pin is {packages[name]}"
                for name, have in change.changes.items()
            )
        )
        return
    if not change.hold:
        host.noop(f"pinned and held: {', '.join(packages) or 'nothing to pin'}")
        return
    yield from install_held(
        os_,
        packages,
        change,
        failure=f"{what}: not at the pinned versions",
        replacing=bool(change.changes),
    )
