"""pyinfra inventory for the local lab that is up (``python -m lab up N``)."""

import sys

from lab.netns import Lab
from runtime.inventory import load_cluster_or_exit, pyinfra_hosts

_lab = Lab()
if not _lab.spec.exists():
    print("trainfleet: the lab is not up; start it with `python -m lab up 3`", file=sys.stderr)
    raise SystemExit(2)

cluster = load_cluster_or_exit(_lab.spec)
nodes = pyinfra_hosts(cluster)
