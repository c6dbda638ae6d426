"""Stale System V shared memory: removed only when the operator asks (deploy/shm_cleanup.py).

Never part of the cluster deploy: a segment with no process attached may still be
wanted (a job between two phases), so removing it is a decision, not convergence.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.shm import StaleSharedMemory
from operations.gather import fact

# Remove each segment only if it is still unattached at this moment: a process that
# attached since the fact was read keeps its segment.
_REMOVE = r"""
for id in "$@"; do
  if awk -v id="$id" '$2 == id && $7 == 0 { found = 1 } END { exit !found }' /proc/sysvipc/shm; then
    ipcrm -m "$id" && echo "removed $id"
  else
    echo "kept $id (attached again, or gone)"
  fi
done
"""


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
    yield StringCommand("sh", "-c", QuoteString(_REMOVE), "trainfleet", *(str(s["shmid"]) for s in stale))
