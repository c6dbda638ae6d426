"""The SSH mesh as data, and the controller's key store."""

from __future__ import annotations

import stat

from trainfleet import Cluster
from trainfleet.keystore import KeyStore
from trainfleet.mesh import authorized_lines, identity, known_hosts_lines

SPEC = """\
cluster: {name: c1, domain: example.com}
nodes:
  - {name: a, address: 192.0.2.1}
  - {name: b, address: 192.0.2.2, ssh: {port: 2222}}
"""


def test_known_hosts_name_every_node_by_name_fqdn_and_address():
    cluster = Cluster.parse(SPEC)
    lines = known_hosts_lines(cluster, {"a": ["ssh-ed25519 AAAA1"], "b": ["ssh-ed25519 BBBB", "ecdsa-sha2-nistp256 CCCC"]})
    assert lines == [
        "a,a.example.com,192.0.2.1 ssh-ed25519 AAAA1",
        "[b]:2222,[b.example.com]:2222,[192.0.2.2]:2222 ssh-ed25519 BBBB",
        "[b]:2222,[b.example.com]:2222,[192.0.2.2]:2222 ecdsa-sha2-nistp256 CCCC",
    ]


def test_keys_are_made_once_0600_in_a_0700_store_and_reused(tmp_path):
    store = KeyStore("c1", root=tmp_path / "keys")
    first = store.keypair("root", "a")
    again = KeyStore("c1", root=tmp_path / "keys").keypair("root", "a")
    assert first == again
    assert first.private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert first.public.startswith("ssh-ed25519 ") and first.public.endswith(" trainfleet:c1:root@a")
    assert stat.S_IMODE((store.dir / "root" / "a").stat().st_mode) == 0o600
    assert stat.S_IMODE((store.dir / "root").stat().st_mode) == 0o700
    assert first.private not in repr(first)


def test_a_revoked_node_leaves_every_authorized_keys_until_rotated(tmp_path):
    cluster = Cluster.parse(SPEC)
    store = KeyStore("c1", root=tmp_path / "keys")
    before = authorized_lines(cluster, "root", store)
    assert len(before) == 2

    store.revoke("root", "b")
    assert authorized_lines(cluster, "root", store) == before[:1]
    assert identity("root", cluster.node("b"), store) is None

    store.rotate("root", "b")
    after = authorized_lines(cluster, "root", store)
    assert after[0] == before[0] and after[1] != before[1]
