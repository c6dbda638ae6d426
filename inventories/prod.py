"""pyinfra inventory for the cluster in prod.yml:
``pyinfra inventories/prod.py deploy/cluster.py``."""

from pathlib import Path

from runtime.inventory import load_cluster_or_exit, pyinfra_hosts

cluster = load_cluster_or_exit(Path(__file__).with_suffix(".yml"))

# The `nodes` group holds every node, in rank order.
nodes = pyinfra_hosts(cluster)
