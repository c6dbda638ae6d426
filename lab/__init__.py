"""The local lab: an N-node cluster on one machine, each node a set of Linux
namespaces with its own sshd, reachable over real SSH at 198.18.0.11, .12, ...

It knows nothing of the product; it writes a cluster spec (``spec.yml`` in its
state dir) that ``inventories/lab.py`` reads.
"""

from lab.netns import Lab, LabError

__all__ = ["Lab", "LabError"]
