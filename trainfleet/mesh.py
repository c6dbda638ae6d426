"""The SSH mesh as data: who trusts whom, and which host keys every node must know.

Plain functions of the cluster model, the key store and gathered host keys;
the operations in operations/ssh_mesh.py only put these lines in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import paramiko

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


def cluster_host_keys(cluster: Cluster, gathered: dict[str, list[str]]) -> tuple[dict[str, list[str]], list[str]]:
    """(every node's host keys, the nodes whose keys came from the controller's known_hosts).

    A node that gave none this run (down, unreadable) keeps its entry from the controller's
    known_hosts, which pyinfra itself verified it against before. The deploy writes these
    and drift expects these.
    """
    keys = {name: found for name, found in gathered.items() if found}
    fallback = [node.name for node in cluster.nodes if node.name not in keys]
    for node in cluster.nodes:
        if node.name in fallback:
            keys[node.name] = controller_known_keys(node.address, node.ssh["port"], node.ssh["known_hosts"])
    return keys, fallback


def controller_known_keys(address: str, port: int, known_hosts: str | None) -> list[str]:
    """A node's host keys in the controller's known_hosts (``type base64``, sorted)."""
    path = Path(known_hosts or "~/.ssh/known_hosts").expanduser()
    if not path.exists():
        return []
    entry = paramiko.HostKeys(str(path)).lookup(address if port == 22 else f"[{address}]:{port}")
    return sorted(f"{k.get_name()} {k.get_base64()}" for k in (entry or {}).values())



FULL_PROBE_ENV = "TRAINFLEET_DRIFT_MESH"  # "full": drift's probe logs in from every node to every node
STRIDE_ENV = "TRAINFLEET_DRIFT_STRIDE"  # pin the sampled probe's stride (2..N-1) instead of rotating it


def probe_env_problems(nodes: int, env: Mapping[str, str]) -> list[str]:
    """What is wrong with the probe settings in ``env`` for a cluster of ``nodes`` (checked
    when the inventory loads, before any host is contacted)."""
    problems = []
    if env.get(FULL_PROBE_ENV, "") not in ("", "full", "sampled"):
        problems.append(f"{FULL_PROBE_ENV} is {env[FULL_PROBE_ENV]!r}: use full or sampled")
    pinned = env.get(STRIDE_ENV, "")
    if pinned and (not (pinned.isascii() and pinned.isdigit()) or not 2 <= int(pinned) <= max(2, nodes - 1)):
        problems.append(f"{STRIDE_ENV} is {pinned!r}: a stride is 2..{max(2, nodes - 1)} for {nodes} nodes")
    return problems


def probe_stride(nodes: int, rotation: int) -> int:
    """The stride of drift's sampled mesh probe, one step further each run (``rotation``):
    2..N-1, so over N-2 runs every ordered pair of nodes is probed once (below four nodes
    the ring and the stride already reach every peer)."""
    return min(nodes - 1, 2) if nodes < 4 else 2 + rotation % (nodes - 2)


def probe_targets(names: list[str], node: str, stride: int) -> list[str]:
    """The peers ``node`` probes: its successor in the ring and the node ``stride`` places on,
    so every node is probed as source and as target by a constant number of logins per node
    (one node: itself). Stride 0: every node, itself included (the full N x N probe)."""
    if not stride:
        return list(names)
    at = names.index(node)
    return list(dict.fromkeys(names[(at + step) % len(names)] for step in (1, stride)))
