"""pyinfra inventory for the spec the ``TRAINFLEET_SPEC`` environment variable names: what
``trainfleet deploy|drift|preflight|capture|remediate SPEC`` runs pyinfra on, so no inventory
module is copied per cluster (``pyinfra inventories/prod.py ...`` keeps working)."""

import os
import sys

from runtime.inventory import load_cluster_or_exit, pyinfra_hosts

spec = os.environ.get("TRAINFLEET_SPEC")
if not spec:
    print(
        "trainfleet: inventories/from_spec.py reads the spec TRAINFLEET_SPEC names "
        "(`trainfleet deploy SPEC` sets it)",
        file=sys.stderr,
    )
    raise SystemExit(2)

cluster = load_cluster_or_exit(spec)

# The `nodes` group holds every node, in rank order.
nodes = pyinfra_hosts(cluster)
