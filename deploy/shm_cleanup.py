"""Remove stale System V shared memory on every node, on request only:
``pyinfra -y inventories/prod.py deploy/shm_cleanup.py``.

Removes the segments no process is attached to (``ipcs -m`` shows them with ``nattch`` 0),
such as a crashed multi-card run leaves behind; the preflight lists them first. Segments
idle for less than 60 s are kept (a job that is starting may not have attached yet);
change that with ``--data trainfleet_shm_min_idle=SECONDS``. Never part of deploy/cluster.py.
"""

from pyinfra import host

from operations import shm_ops
from runtime.gather import this_node

cluster, node = this_node()

min_idle = int(host.data.get("trainfleet_shm_min_idle", 60))
shm_ops.stale_segments_removed(
    name=f"Stale shared memory removed (unattached for {min_idle} s or more)",
    min_idle_seconds=min_idle,
)
