"""gcc at the spec's major: Debian/Ubuntu ``gcc-N`` selected with update-alternatives;
RHEL-family a devtoolset/gcc-toolset enabled for login shells from the profile the plan
rendered (``StackPlan.gcc_files``, templates/stack/gcc_profile.sh.j2)."""

from __future__ import annotations

import re

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from facts.stack_facts import StackVersionsT
from operations.packages_ops import APT, rpm_ensure
from operations.remote import fail_command, write_file_command
from operations.stack_state import stack_fact, unsupported
from trainfleet.capabilities.stack import StackPlan
from trainfleet.defaults import GCC_PROFILE
from trainfleet.osfamily import OsFamilyT


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


def debian_gcc(n: int) -> list[StringCommand]:
    """Install gcc-N and g++-N and make them /usr/bin/gcc and g++ (update-alternatives)."""
    return [
        StringCommand(APT, "install", "-y", "-q", f"gcc-{n}", f"g++-{n}"),
        StringCommand(
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
        ),
        StringCommand("update-alternatives", "--set", "gcc", f"/usr/bin/gcc-{n}"),
    ]


def rhel_toolset(
    current: StackVersionsT, n: int, toolset: str, profile: str
) -> list[StringCommand]:
    """The toolset installed where it is not, and its profile (the plan's text) written where
    the node's differs."""
    commands = []
    if (current["toolsets"].get(toolset) or {}).get("major") != n:
        commands.append(toolset_install(current["os"], toolset))
    if current["gcc_profile"] != profile:
        commands.append(write_file_command(GCC_PROFILE, profile))
    return commands


@operation()
def gcc(stack: StackPlan):
    """
    Make gcc ``stack.gcc`` the compiler: Debian/Ubuntu ``gcc-N`` selected with
    update-alternatives; RHEL 8/9 ``gcc-toolset-N``, CentOS/RHEL 7 ``devtoolset-N``, each enabled
    for login shells from ``/etc/profile.d/trainfleet-gcc.sh``. A system gcc of that major needs
    nothing.

    + stack: the node's ``StackPlan``: ``gcc``, the GCC major version (e.g. ``"11"``, the spec's
      ``stack.gcc``) and, on RHEL-family, what the plan made of it for the node's OS:
      ``gcc_toolset`` and ``gcc_files`` (the profile's text; None where the system gcc is the
      pinned one and no profile may be left)

    **Example:**

    .. code:: python

        stack_gcc_ops.gcc(name="gcc 11", stack=plan.stack)
    """
    major = stack.gcc
    if not re.fullmatch(r"\d{1,2}", str(major)):
        raise OperationValueError(f"gcc: {major!r} is not a GCC major version (e.g. '11')")
    n = int(str(major))
    current = stack_fact()
    os_ = current["os"]
    if os_["family"] == "debian":
        if (current["system_gcc"] or {}).get("major") == n:  # not PATH: a toolset would mask it
            host.noop(f"gcc {n} is /usr/bin/gcc")
            return
        yield from debian_gcc(n)
        return
    if os_["family"] != "rhel":
        yield unsupported(os_, "gcc")
        return
    if GCC_PROFILE not in stack.gcc_files:
        yield fail_command(f"gcc: no toolset planned for {os_['id']} {os_['version']}")
        return
    toolset, profile = stack.gcc_toolset, stack.gcc_files[GCC_PROFILE]
    if toolset is None or profile is None:  # the distribution's own gcc: no toolset, no profile
        if current["gcc_profile"] is None:
            host.noop(f"gcc {n} is the system gcc")
            return
        yield StringCommand("rm", "-f", GCC_PROFILE)
        return
    commands = rhel_toolset(current, n, toolset, profile)
    if not commands:
        host.noop(f"gcc {n} from {toolset} is enabled for login shells")
        return
    yield from commands
