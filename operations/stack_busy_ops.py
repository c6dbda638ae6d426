"""A running job's stack is not changed under it: what runs on the venv and the GPUs (read by
the StackVersions fact, probed again right before a change), and the decision to hold the
stack's changes back on that node, named for people."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import StringCommand

from facts.shell import shell
from facts.stack_facts import BUSY_PROBE, StackVersionsT
from operations.remote import script

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
