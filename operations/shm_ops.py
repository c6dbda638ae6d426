"""Stale System V shared memory: removed only when the operator asks (deploy/shm_cleanup.py).

Never part of the cluster deploy: a segment with no process attached may still be
wanted (a job between two phases), so removing it is a decision, not convergence.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from facts.shell import shell
from facts.shm_facts import SHMID_MAX, Segment, StaleSharedMemory
from operations.remote import script
from runtime.gather import fact

# Remove each segment only if it is still unattached at this moment: a process that
# attached since the fact was read keeps its segment. Ids are digits only, checked here too.
_REMOVE = script("shm_remove.sh")


@operation()
def stale_segments_removed(min_idle_seconds: int = 60):
    """
    Remove the node's System V shared memory segments that no process is attached to.

    + min_idle_seconds: leave segments detached (or created) more recently than this; a
      job that is starting may not have attached yet

    **Example:**

    .. code:: python

        shm.stale_segments_removed(name="Remove stale shared memory", min_idle_seconds=3600)
    """
    stale = [s for s in fact(StaleSharedMemory) if s["idle_seconds"] >= min_idle_seconds]
    if not stale:
        host.noop(f"no shared memory segment unattached for {min_idle_seconds} s or more")
        return
    yield remove_command(stale)


def remove_command(segments: list[Segment]) -> StringCommand:
    """The command that removes these segments; each id must be an int in the kernel's range (the
    fact's parser gives nothing else), so nothing the node printed reaches the shell as text."""
    ids = [s["shmid"] for s in segments]
    bad = [i for i in ids if type(i) is not int or not 0 <= i <= SHMID_MAX]
    if bad:
        raise ValueError(f"not shared memory ids: {bad!r}")
    return shell(_REMOVE, *ids)
