"""pyinfra inventory for the local lab that is up, with the launch stack pinned (make demo):
torch, accelerate and DeepSpeed from `make host-deps`' wheelhouse, Debian's OpenMPI."""

import sys

import yaml

from lab.lab_stack import launch_stack
from lab.netns import Lab
from runtime.inventory import load_cluster_or_exit, pyinfra_hosts

_lab = Lab()
if not _lab.spec.exists():
    print("trainfleet: the lab is not up; start it with `python -m lab up 3`", file=sys.stderr)
    raise SystemExit(2)

# The lab's own spec plus the stack, written beside it (the cluster is still "lab").
_spec = yaml.safe_load(_lab.spec.read_text())
_spec["stack"] = launch_stack()
_launch_spec = _lab.spec.with_name("lab-launch.yml")
_launch_spec.write_text(
    "# Written by inventories/lab_launch.py: the lab's spec with the launch stack.\n"
    + yaml.safe_dump(_spec, sort_keys=False)
)
cluster = load_cluster_or_exit(_launch_spec)
nodes = pyinfra_hosts(cluster)
