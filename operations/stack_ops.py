"""The pinned software stack, the one operation deploy/cluster.py calls: ``software`` applies
the node's StackPlan from ONE StackVersions fact, composing the parts, each in its module:

- operations/stack_repo_ops.py: NVIDIA's CUDA repository (keyring, the apt list or .repo file);
- operations/stack_packages_ops.py: CUDA/cuDNN/NCCL/OpenMPI/driver packages, exact and held;
- operations/stack_gcc_ops.py: gcc (update-alternatives, or a toolset and its profile);
- operations/stack_venv_ops.py: the torch venv and the Python packages beside torch;
- operations/stack_busy_ops.py: nothing a running job loads is changed under it.

The values come from the node's plan (``trainfleet.capabilities.stack.StackPlan``: packages
resolved for its OS family, the torch build, repository settings, and the files the plan
rendered from templates/stack/), never from the spec.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from facts.stack_facts import StackVersions
from operations.remote import FailCommand
from operations.stack_busy_ops import BUSY_OK, busy_guard, held_under_a_job
from operations.stack_gcc_ops import gcc
from operations.stack_packages_ops import packages
from operations.stack_repo_ops import cuda_repo
from operations.stack_venv_ops import python_packages, torch_venv
from runtime.gather import fact, lent
from trainfleet.capabilities.stack import FROM_CUDA_REPO, PACKAGED, StackPlan
from trainfleet.defaults import VENV_DIR
from trainfleet.pins import torch_requirement

# held_under_a_job: operations/gpu_node_ops.py holds the fabric manager back by the same rule
# (it may import it from operations/stack_busy_ops.py directly)
__all__ = ["held_under_a_job", "software"]

# One part of the stack: what a running job loads, named for people where the part changes it
# (packages, the venv; "" otherwise), and the part's commands.
Part = tuple[str, list[StringCommand]]


def planned_parts(stack: StackPlan, venv: str) -> list[Part]:
    """Each part the plan pins, with the commands that bring the node to it (the fact is lent)."""
    parts: list[Part] = []
    if not FROM_CUDA_REPO.isdisjoint(stack.pinned):
        parts.append(("", list(cuda_repo._inner(stack=stack))))
    if not PACKAGED.isdisjoint(stack.pinned):
        pinned = packages._inner(
            pins=stack.packages, allow_change=stack.allow_change, problems=stack.problems
        )
        parts.append((f"packages {', '.join(sorted(stack.packages))}", list(pinned)))
    if stack.gcc:
        parts.append(("", list(gcc._inner(stack=stack))))
    if stack.torch:
        parts += venv_parts(stack, stack.torch, venv)
    return parts


def venv_parts(stack: StackPlan, torch: str, venv: str) -> list[Part]:
    """torch in the venv, then the Python packages pinned beside it (torch kept)."""
    venv_torch = torch_venv._inner(
        venv=venv,
        torch_version=torch,
        variant=stack.torch_variant,
        index_url=stack.torch_index,
        wheelhouse=stack.wheelhouse,
        allow_change=stack.allow_change,
    )
    parts: list[Part] = [(f"torch {torch} in {venv}", list(venv_torch))]
    if stack.python:
        beside = python_packages._inner(
            venv=venv,
            packages=stack.python,
            no_deps=stack.no_deps,
            keep=torch_requirement(torch, stack.torch_variant),
            wheelhouse=stack.wheelhouse,
            allow_change=stack.allow_change,
        )
        parts.append((f"{', '.join(sorted(stack.python))} in {venv}", list(beside)))
    return parts


@operation()
def software(stack: StackPlan, venv: str = VENV_DIR):
    """
    The node's whole stack plan: CUDA repository, CUDA/cuDNN/NCCL/OpenMPI packages (exact,
    held), gcc and the torch venv with its other pinned Python packages, each only where the
    spec pins it, from ONE StackVersions fact.

    + stack: the node's ``StackPlan`` (trainfleet/capabilities/stack.py): resolved packages,
      torch build, venv packages, repository settings, gcc, ``allow_change``, and the files
      rendered for the node (the CUDA repository's, gcc's profile)
    + venv: the node venv

    **Example:**

    .. code:: python

        stack_ops.software(name="Pinned software stack", stack=plan.stack)
    """
    if not stack.pinned:
        host.noop("no stack component is pinned")
        return
    current = fact(StackVersions, venv=venv)
    # Lent under the venv the torch part asks with and the default the package parts ask with.
    with lent(StackVersions, current, venv=venv), lent(StackVersions, current, venv=VENV_DIR):
        parts = planned_parts(stack, venv)
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
