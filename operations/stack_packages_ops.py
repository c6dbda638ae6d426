"""The stack's packages (CUDA toolkit, cuDNN, NCCL, OpenMPI, the NVIDIA driver) at exactly the
plan's versions, held, with operations/packages_ops.py's one exact-and-held helper."""

from __future__ import annotations

from collections.abc import Collection

from pyinfra.api import operation

from operations.packages_ops import held
from operations.remote import fail_command
from operations.stack_state import stack_fact
from trainfleet.pins import Pins


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

        stack_packages_ops.packages(name="CUDA, cuDNN, NCCL pinned", pins=plan.stack.packages)
    """
    current = stack_fact()
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
