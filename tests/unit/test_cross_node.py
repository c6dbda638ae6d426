"""Cross-node rules live in the model, once: the deploy writes from them and drift expects
them, so drift never expects what the deploy refuses to write (issue #14)."""

from __future__ import annotations

import copy

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from operations.drift import expect
from operations.nccl_env import nccl_env
from operations.remote import FailCommand
from tests.unit.test_nccl_env import AUTO, ib_ports
from trainfleet import mesh
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster
from trainfleet.nccl import derive_cluster

SPEC = """\
cluster: {name: roce}
nodes:
  - {name: gpu-a01, address: 198.18.0.11}
  - {name: gpu-a02, address: 198.18.0.12}
"""


def network(address: str, gid_index: int) -> dict:
    """A RoCE v2 node (the ConnectX-6 sysfs tree) whose IPv4 GID sits at ``gid_index``."""
    ports = copy.deepcopy(ib_ports("roce_v2_cx6"))
    for gid in ports[0]["gids"]:
        if gid["index"] == 5:
            gid["index"] = gid_index
    interfaces = [{"name": "lo", "addresses": ["127.0.0.1"], "bridge": False},
                  {"name": "eth0", "addresses": [address], "bridge": False}]
    return {"interfaces": interfaces, "ib_ports": ports}


def test_nodes_that_disagree_on_the_gid_index_are_refused_by_the_deploy_and_not_expected_by_drift(tmp_path):
    cluster = Cluster.parse(SPEC)
    derived = derive_cluster(cluster, {"gpu-a01": network("198.18.0.11", 5), "gpu-a02": network("198.18.0.12", 3)})
    keys = KeyStore(cluster.name, root=tmp_path)
    host_keys, _ = mesh.cluster_host_keys(cluster, {"gpu-a01": ["ssh-ed25519 AAAA1"], "gpu-a02": ["ssh-ed25519 AAAA2"]})
    for node in cluster.nodes:
        mine = derived[node.name]
        assert mine.problems == ["NCCL_IB_GID_INDEX differs between nodes: gpu-a01=5, gpu-a02=3"]
        # The deploy: the node fails its NCCL step and writes nothing.
        commands = list(nccl_env._inner(env=mine.env, problems=mine.problems))
        assert len(commands) == 1 and isinstance(commands[0], FailCommand)
        # Drift, from the same derivation: no NCCL files or variables expected of it.
        expected = expect(cluster, node, keys, host_keys, derived)
        assert not {prop for prop in expected if prop.startswith("NCCL env")}


def test_nodes_that_agree_are_expected_exactly_as_the_deploy_writes():
    cluster = Cluster.parse(SPEC)
    derived = derive_cluster(cluster, {"gpu-a01": network("198.18.0.11", 5), "gpu-a02": network("198.18.0.12", 5)})
    assert all(d.problems == [] and d.env["NCCL_IB_GID_INDEX"] == "5" for d in derived.values())


def test_a_node_that_gave_no_host_keys_gets_them_from_the_controllers_known_hosts_for_both(tmp_path):
    public = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    known = tmp_path / "known_hosts"
    known.write_text(f"198.18.0.12 {public}\n")
    cluster = Cluster.parse(SPEC.replace("address: 198.18.0.12}", f"address: 198.18.0.12, ssh: {{known_hosts: {known}}}}}"))
    keys, fallback = mesh.cluster_host_keys(cluster, {"gpu-a01": ["ssh-ed25519 AAAA1"], "gpu-a02": []})
    assert fallback == ["gpu-a02"]
    assert keys == {"gpu-a01": ["ssh-ed25519 AAAA1"], "gpu-a02": [public]}
