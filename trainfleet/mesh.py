"""The SSH mesh as data: who trusts whom, and which host keys every node must know.

Plain functions of the cluster model, the key store and gathered host keys;
the operations in operations/ssh_mesh.py only put these lines in place.
"""

from __future__ import annotations

from trainfleet.keystore import KeyPair, KeyStore
from trainfleet.model import Cluster, Node


def host_patterns(node: Node) -> list[str]:
    """known_hosts names for a node: short name, FQDN and address (``[h]:port`` off port 22)."""
    names = [node.name, *([node.fqdn] if node.fqdn else []), node.address]
    port = node.ssh["port"]
    return names if port == 22 else [f"[{name}]:{port}" for name in names]


def known_hosts_lines(cluster: Cluster, host_keys: dict[str, list[str]]) -> list[str]:
    """One line per node and key type, for every node whose host keys are known."""
    return [f"{','.join(host_patterns(node))} {key}"
            for node in cluster.nodes for key in host_keys.get(node.name, [])]


def authorized_lines(cluster: Cluster, user: str, keys: KeyStore) -> list[str]:
    """Every cluster node's public key for ``user`` (revoked nodes left out), node order."""
    return [keys.keypair(user, node.name).public
            for node in cluster.nodes if not keys.is_revoked(user, node.name)]


def identity(user: str, node: Node, keys: KeyStore) -> KeyPair | None:
    """The key the node uses to reach its peers; None once revoked."""
    return None if keys.is_revoked(user, node.name) else keys.keypair(user, node.name)
