"""The cluster, capability by capability: ``pyinfra inventories/prod.py deploy/cluster.py``.

Each line is one capability; its operation lives in operations/<capability>.py,
its facts in facts/<capability>.py, its templates in templates/<capability>/.
"""

from operations import hosts
from trainfleet.inventory import this_node

cluster, node = this_node()

# Names: every node knows itself and every peer by name.
hosts.hostname(name="Hostname is the node's spec name", hostname=node.name)
hosts.hosts_block(name="Cluster hosts block in /etc/hosts", entries=cluster.hosts_entries())
