"""The certificate mesh (issue #18): host patterns, the CA lines, host and user certificates
and their renewal, the KRL of revoked mesh keys, the sshd fact, and the operations that put
them in place. What OpenSSH itself must accept is checked with OpenSSH's own tools
(``ssh -G``, ``ssh-keygen -F / -L / -Q``)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import shlex
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pyinfra.api.exceptions import FactProcessError
from pyinfra.context import ctx_host, ctx_state
from pyinfra_testing.util import FakeState, create_host

from facts.managed_block_facts import block_state
from facts.ssh_mesh_facts import (
    _SSHD_SCRIPT,
    AUTHORIZED_PURPOSE,
    CONFIG_PURPOSE,
    SshdMesh,
    SshMeshUser,
)
from operations.remote import ABSENT, FailCommand
from operations.ssh_mesh_ops import (
    mesh_trust,
    mesh_user,
    mesh_users_failed,
    revoked_keys,
    sshd_certificates,
)
from runtime.gather import HomeIntact, _key, note_home_failure, run_facts
from tests.unit.test_krl import revoked
from tests.unit.test_plan import fresh_sshd, planned, prepared, public_key
from trainfleet import certificates, keystore, mesh
from trainfleet.blocks import markers, split_block, with_block
from trainfleet.capabilities.ssh_mesh import SshdPlan, sshd_part
from trainfleet.defaults import REVOKED_KEYS, SSH_MESH_CONF, SSHD_MESH_CONF
from trainfleet.keystore import KeyStore
from trainfleet.mesh import (
    ca_known_hosts_lines,
    cluster_patterns,
    host_principals,
    name_pattern,
    pattern_matches,
    plan_certificates,
)
from trainfleet.model import Cluster
from trainfleet.plan import plan_cluster
from trainfleet.plan_types import ClusterPlan, Gathered
from trainfleet.spec import SpecError, parse_cluster, parse_spec

needs_openssh = pytest.mark.skipif(
    shutil.which("ssh") is None or shutil.which("ssh-keygen") is None,
    reason="needs OpenSSH's ssh and ssh-keygen",
)

ED25519_CERT = "/etc/ssh/ssh_host_ed25519_key-cert.pub"
RSA_CERT = "/etc/ssh/ssh_host_rsa_key-cert.pub"
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)

# Two sshd ports, a domain: every kind of name a cluster node has.
MIXED = """\
cluster: {name: mix, domain: cluster.example.com, mesh_users: [root, alice]}
nodes:
  - {name: gpu-a01, address: 198.18.0.11}
  - {name: gpu-a02, address: 198.18.0.12}
  - {name: gpu-b01, address: "2001:db8::b1", ssh: {port: 2222}}
  - {name: gpu-b02, address: "2001:db8::b2", ssh: {port: 2222}}
"""


def big_spec(n: int, mode: str = "certificates", ipv6: bool = False) -> str:
    """``n`` nodes gpu0001.. in one naming scheme (IPv6 addresses keep one width for any n <
    4096)."""
    lines = [
        "cluster: {name: big, domain: cluster.example.com, mesh_users: [root]}",
        f"ssh: {{mesh: {mode}}}",
        "nodes:",
    ]
    for i in range(1, n + 1):
        address = f'"fd00:18::{0x1000 + i:x}"' if ipv6 else f"198.18.{i // 256}.{i % 256}"
        lines.append(f"  - {{name: gpu{i:04d}, address: {address}}}")
    return "\n".join(lines) + "\n"


_HOST_KEYS: dict[
    tuple[str, str], str
] = {}  # a node keeps its host key from plan to plan, as a real one does


def host_key_of(cluster: Cluster, node: str) -> str:
    return _HOST_KEYS.setdefault((cluster.name, node), public_key())


def gathered_for(
    cluster: Cluster,
    host_keys: dict[str, list[str]] | None = None,
    sshd: dict | None = None,
    user_certificates: dict | None = None,
) -> Gathered:
    return Gathered(
        host_keys=host_keys or {n.name: [host_key_of(cluster, n.name)] for n in cluster.nodes},
        sshd=sshd if sshd is not None else {n.name: fresh_sshd() for n in cluster.nodes},
        user_certificates=user_certificates or {},
    )


def plan_of(cluster: Cluster, keys_root: Path, **gathered: Any) -> ClusterPlan:
    return planned(
        cluster, gathered_for(cluster, **gathered), KeyStore(cluster.name, root=keys_root)
    )


def all_names(cluster: Cluster) -> list[str]:
    return [name for node in cluster.nodes for name in host_principals(node)]


# -- host patterns ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, pattern",
    [
        ("gpu-a01", "gpu-a??"),
        (
            "gpu-a01.cluster.example.com",
            "gpu-a??.cluster.example.com",
        ),  # only the first label's digits
        ("n1.rack2.example.com", "n?.rack2.example.com"),
        ("198.18.0.11", "198.18.0.??"),  # IPv4: the last octet only
        ("198.18.0.7", "198.18.0.?"),
        ("2001:db8::b1", "2001:db8::??"),  # IPv6: the last group, hex letters included
        ("fd00:18::1001", "fd00:18::????"),
        ("head", "head"),  # nothing to generalise
    ],
)
def test_a_name_pattern_turns_digits_of_a_first_label_or_an_address_last_part_into_question_marks(
    name, pattern
):
    assert name_pattern(name) == pattern
    assert pattern_matches(pattern, name)


def test_a_thousand_nodes_need_a_handful_of_patterns_and_each_name_is_matched_by_its_groups():
    hundred, thousand = parse_cluster(big_spec(100)), parse_cluster(big_spec(1024))
    ((port_100, patterns_100),), ((port, patterns),) = (
        cluster_patterns(hundred),
        cluster_patterns(thousand),
    )
    assert port == port_100 == 22
    # The names are one scheme whatever N: the same two patterns for 100 nodes and for 1024.
    names = [p for p in patterns if not p.startswith("198.")]
    assert (
        names
        == [p for p in patterns_100 if not p.startswith("198.")]
        == ["gpu????", "gpu????.cluster.example.com"]
    )
    # IPv4 addresses: one pattern per /24 and last-octet width (198.18.0-4.x: 13), not one per node.
    assert sorted(p for p in patterns if p.startswith("198.")) == sorted(
        [f"198.18.{o}.{'?' * w}" for o in range(4) for w in (1, 2, 3)] + ["198.18.4.?"]
    )
    assert len(patterns) == 15 < len(all_names(thousand)) == 3072
    for name in all_names(thousand):
        assert any(pattern_matches(p, name) for p in patterns), name
    assert not any(
        pattern_matches(p, other)
        for p in patterns
        for other in ("gpu001", "gpu00001", "gpu0001.example.com", "198.18.5.1", "github.com")
    )


def test_a_group_whose_patterns_would_match_a_node_on_another_port_lists_its_names_as_they_are():
    cluster = parse_cluster("""\
cluster: {name: ports, mixed_subnets: true}
nodes:
  - {name: gpu-a01, address: 198.18.0.11}
  - {name: gpu-a02, address: 198.18.0.12}
  - {name: gpu-a03, address: 198.18.0.13, ssh: {port: 2222}}
  - {name: cpu-b01, address: 198.18.1.21, ssh: {port: 2200}}
""")
    assert cluster_patterns(cluster) == [
        (22, ["gpu-a01", "198.18.0.11", "gpu-a02", "198.18.0.12"]),  # gpu-a?? would match gpu-a03
        (2222, ["gpu-a03", "198.18.0.13"]),  # gpu-a?? would match gpu-a01
        (2200, ["cpu-b??", "198.18.1.??"]),  # reaches no other port's node: stays a pattern
    ]
    groups = dict(cluster_patterns(cluster))
    for node in cluster.nodes:
        for name in host_principals(node):
            assert [
                port for port, pats in groups.items() if any(pattern_matches(p, name) for p in pats)
            ] == [node.ssh["port"]], name


def ssh_config_file(tmp_path: Path, block: list[str]) -> Path:
    """~/.ssh/config as trainfleet leaves it: its block first, then the user's own defaults."""
    begin, end = markers(CONFIG_PURPOSE)
    config = tmp_path / "config"
    config.write_text(
        "\n".join([begin, *block, end, "Host *", "    User alice", "    Port 2200"]) + "\n"
    )
    return config


def ssh_resolved(config: Path, name: str) -> dict[str, list[str]]:
    out = subprocess.run(
        ["ssh", "-G", "-F", str(config), name], capture_output=True, text=True, check=True
    ).stdout
    resolved: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        resolved.setdefault(key, []).append(value)
    return resolved


@needs_openssh
def test_ssh_gives_cluster_names_the_planned_user_port_and_key_and_other_hosts_nothing(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    plan = plan_of(cluster, tmp_path / "keys")
    config = ssh_config_file(tmp_path, plan.nodes["gpu-a01"].ssh_mesh.users[1].config)  # alice's
    for node in cluster.nodes:
        for name in host_principals(node)[:-1]:  # names: what pdsh, mpirun and the launchers ssh to
            got = ssh_resolved(config, name)
            assert (got["user"], got["port"]) == (["alice"], [str(node.ssh["port"])]), name
            assert got["identityfile"] == ["~/.ssh/id_trainfleet"] and got["identitiesonly"] == [
                "yes"
            ], name
    # Not addresses: the block comes first, and a subnet pattern would take the user's own
    # entries for other hosts there (a gateway at 198.18.0.1).
    for other in (
        "github.com",
        "gpu-c01",
        "198.18.0.111",
        "2001:db8::1b1",
        "198.18.0.1",
        "198.18.0.11",
    ):
        got = ssh_resolved(config, other)
        assert got["port"] == ["2200"] and "~/.ssh/id_trainfleet" not in got["identityfile"], other


@needs_openssh
def test_a_node_named_in_capitals_is_reached_through_the_planned_config(tmp_path):
    cluster = parse_cluster("""\
cluster: {name: caps}
nodes:
  - {name: GPU-A01, address: 198.18.0.11, ssh: {port: 2222}}
  - {name: GPU-A02, address: 198.18.0.12, ssh: {port: 2222}}
""")
    plan = plan_of(cluster, tmp_path / "keys")
    config = ssh_config_file(tmp_path, plan.nodes["GPU-A01"].ssh_mesh.users[0].config)
    got = ssh_resolved(config, "GPU-A02")  # the name every launcher uses
    assert (got["port"], got["identityfile"]) == (["2222"], ["~/.ssh/id_trainfleet"])


# -- the known_hosts CA lines and host certificates, read by OpenSSH -----------------------------


@needs_openssh
def test_the_known_hosts_ca_lines_vouch_for_every_cluster_name_at_its_port_and_for_nothing_else(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    plan = plan_of(cluster, tmp_path / "keys")
    lines = plan.nodes["gpu-a02"].ssh_mesh.known_hosts
    ca = KeyStore(cluster.name, root=tmp_path / "keys").certificate_authority()
    assert (
        lines == ca_known_hosts_lines(cluster, ca.public) and len(lines) == 2
    )  # one line per port
    assert lines[1].startswith(
        "@cert-authority [gpu-b??]:2222,[gpu-b??.cluster.example.com]:2222,"
        "[2001:db8::??]:2222 ssh-ed25519 "
    )
    known = tmp_path / "ssh_known_hosts"
    known.write_text("\n".join(lines) + "\n")

    def found(host: str) -> str | None:
        result = subprocess.run(
            ["ssh-keygen", "-F", host, "-f", str(known)], capture_output=True, text=True
        )
        assert result.returncode in (0, 1), result.stderr
        return result.stdout if result.returncode == 0 else None

    for node in cluster.nodes:
        for name in host_principals(node):
            host = name if node.ssh["port"] == 22 else f"[{name}]:{node.ssh['port']}"
            shown = found(host)
            assert shown and " CA\n" in shown and " ".join(ca.public.split()[:2]) in shown, host
            if node.ssh["port"] != 22:
                assert found(name) is None  # port 22 is another host as far as known_hosts goes
    for other in ("github.com", "gpu-a01.example.com", "[gpu-a01]:2222", "198.18.0.111"):
        assert found(other) is None, other


@needs_openssh
def test_a_host_certificate_names_the_node_its_fqdn_and_its_address_in_lower_case(tmp_path):
    cluster = parse_cluster("""\
cluster: {name: prod, domain: Cluster.Example.COM}
nodes:
  - {name: GPU-A01, address: 198.18.0.11}
  - {name: gpu-b01, address: "2001:db8::b1", ssh: {port: 2222}}
""")
    host_keys = {n.name: [public_key()] for n in cluster.nodes}
    plan = plan_of(cluster, tmp_path / "keys", host_keys=host_keys)
    ca = KeyStore("prod", root=tmp_path / "keys").certificate_authority()
    for node, principals in (
        (cluster.nodes[0], ["gpu-a01", "gpu-a01.cluster.example.com", "198.18.0.11"]),
        (cluster.nodes[1], ["gpu-b01", "gpu-b01.cluster.example.com", "2001:db8::b1"]),
    ):
        ((path, line),) = plan.nodes[node.name].ssh_mesh.sshd.certificates.items()
        assert path == ED25519_CERT and line.endswith(f" trainfleet:prod:host:{node.name}\n")
        cert = tmp_path / f"{node.name}-cert.pub"
        cert.write_text(line)
        shown = subprocess.run(
            ["ssh-keygen", "-L", "-f", str(cert)], capture_output=True, text=True, check=True
        ).stdout
        assert "Type: ssh-ed25519-cert-v01@openssh.com host certificate" in shown
        assert f"Signing CA: ED25519 {certificates.fingerprint(ca.public)}" in shown
        assert f'Key ID: "trainfleet:prod:host:{node.name}"' in shown
        assert shown.split("Principals: \n")[1].split("Critical Options:")[0].split() == principals
        assert certificates.read(line).key == host_keys[node.name][0]


# -- renewal -------------------------------------------------------------------------------------


def test_a_rerun_with_the_nodes_current_certificates_keeps_every_one_byte_for_byte(tmp_path):
    cluster = parse_cluster(MIXED)
    host_keys = {n.name: [public_key()] for n in cluster.nodes}
    first = plan_of(cluster, tmp_path / "keys", host_keys=host_keys)
    sshd = {
        name: {
            **fresh_sshd(),
            "certificates": {
                path: line.strip() for path, line in p.ssh_mesh.sshd.certificates.items()
            },
        }
        for name, p in first.nodes.items()
    }
    users = {
        name: {u.user: u.certificate.strip() for u in p.ssh_mesh.users}
        for name, p in first.nodes.items()
    }
    again = plan_of(
        cluster, tmp_path / "keys", host_keys=host_keys, sshd=sshd, user_certificates=users
    )
    for name in first.nodes:
        assert again.nodes[name].ssh_mesh.sshd == first.nodes[name].ssh_mesh.sshd
        assert [u.certificate for u in again.nodes[name].ssh_mesh.users] == [
            u.certificate for u in first.nodes[name].ssh_mesh.users
        ]
    # ... and without them, every certificate is new (new serials).
    fresh = plan_of(cluster, tmp_path / "keys", host_keys=host_keys)
    assert all(
        fresh.nodes[n].ssh_mesh.sshd.certificates != first.nodes[n].ssh_mesh.sshd.certificates
        for n in first.nodes
    )


def test_a_certificate_is_signed_again_in_its_last_third_or_for_another_ca_key_or_principals(
    tmp_path,
):
    cluster = parse_cluster(MIXED + "ssh: {certificate_days: 30}\n")
    certs = plan_certificates(
        cluster, prepared(KeyStore("mix", root=tmp_path / "keys"), cluster), now=NOW
    )
    assert certs.validity == timedelta(days=30) and certs.renew_before == timedelta(days=10)
    key = public_key()
    line = certs.certificate(
        None, key, "host", ["gpu-a01", "198.18.0.11"], "trainfleet:mix:host:gpu-a01"
    )

    def again(c, public=key, principals=("gpu-a01", "198.18.0.11")):
        return c.certificate(line, public, "host", list(principals), "trainfleet:mix:host:gpu-a01")

    assert again(certs) == line
    assert (
        again(certs, principals=("198.18.0.11", "gpu-a01")) == line
    )  # the same principals, in any order
    assert (
        again(dataclasses.replace(certs, now=NOW + timedelta(days=19, hours=23))) == line
    )  # a third left
    due = again(dataclasses.replace(certs, now=NOW + timedelta(days=20, hours=1)))
    assert due != line and certificates.read(due).valid_before == NOW + timedelta(days=50, hours=1)

    other_ca = plan_certificates(
        cluster, prepared(KeyStore("mix", root=tmp_path / "other"), cluster), now=NOW
    )
    assert certificates.read(again(other_ca)).ca_fingerprint == certificates.fingerprint(
        other_ca.ca_public
    )
    new_key = public_key()
    assert certificates.read(again(certs, public=new_key)).key == new_key
    assert certificates.read(again(certs, principals=("gpu-a01",))).principals == ("gpu-a01",)
    assert (
        certs.certificate("ssh-ed25519 AAAA not-a-certificate", key, "host", ["gpu-a01"], "k")
        != line
    )


def test_a_certificate_that_outlives_a_shortened_validity_is_signed_anew(tmp_path):
    year = parse_cluster(MIXED)
    month = parse_cluster(MIXED + "ssh: {certificate_days: 30}\n")
    key = public_key()
    line = plan_certificates(
        year, prepared(KeyStore("mix", root=tmp_path / "keys"), year), now=NOW
    ).certificate(None, key, "host", ["gpu-a01"], "trainfleet:mix:host:gpu-a01")
    shortened = plan_certificates(
        month, prepared(KeyStore("mix", root=tmp_path / "keys"), month), now=NOW + timedelta(days=1)
    )
    again = shortened.certificate(line, key, "host", ["gpu-a01"], "trainfleet:mix:host:gpu-a01")
    assert again != line and certificates.read(again).valid_before == NOW + timedelta(days=31)
    # ... and one signed for the shortened validity is kept from then on.
    assert (
        shortened.certificate(again, key, "host", ["gpu-a01"], "trainfleet:mix:host:gpu-a01")
        == again
    )


def test_a_plan_signs_again_a_host_and_a_user_certificate_the_node_holds_in_their_last_third(
    tmp_path,
):
    cluster = parse_cluster(
        "cluster: {name: short}\nssh: {certificate_days: 3}\n"
        "nodes:\n  - {name: gpu-a01, address: 198.18.0.11}\n"
    )
    keys = KeyStore("short", root=tmp_path / "keys")
    host_key = public_key()
    old = plan_certificates(
        cluster, prepared(keys, cluster), now=datetime.now(UTC) - timedelta(days=2, hours=1)
    )
    host_line = old.certificate(
        None, host_key, "host", ["gpu-a01", "198.18.0.11"], "trainfleet:short:host:gpu-a01"
    )
    user_line = old.certificate(None, keys.keypair("root", "gpu-a01").public, "user", ["root"], "x")
    plan = plan_of(
        cluster,
        tmp_path / "keys",
        host_keys={"gpu-a01": [host_key]},
        sshd={"gpu-a01": {**fresh_sshd(), "certificates": {ED25519_CERT: host_line}}},
        user_certificates={"gpu-a01": {"root": user_line}},
    )
    node = plan.nodes["gpu-a01"]
    for new, was in (
        (node.ssh_mesh.sshd.certificates[ED25519_CERT], host_line),
        (node.ssh_mesh.users[0].certificate, user_line),
    ):
        assert new.strip() != was
        assert certificates.read(new).time_left(datetime.now(UTC)) > timedelta(days=2, hours=23)


# -- the KRL of revoked mesh keys ---------------------------------------------------------------


@needs_openssh
def test_the_krl_refuses_exactly_the_revoked_rotated_and_retired_mesh_keys_and_their_certificates(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    root = tmp_path / "keys"
    before = plan_of(cluster, root)
    store = KeyStore("mix", root=root)
    old = {
        (u.user, name): (u.identity.public, u.certificate.strip())
        for name, p in before.nodes.items()
        for u in p.ssh_mesh.users
    }
    store.revoke("alice", "gpu-a02")
    store.rotate("root", "gpu-b01")
    store.retire_absent(["gpu-a01", "gpu-a02", "gpu-b01"])  # gpu-b02 left the spec (and comes back)
    gone = [("alice", "gpu-a02"), ("root", "gpu-b01"), ("root", "gpu-b02"), ("alice", "gpu-b02")]
    after = plan_of(cluster, root)
    krl = tmp_path / "revoked_keys"
    krl.write_bytes(after.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys)
    assert all(
        p.ssh_mesh.sshd.revoked_keys == krl.read_bytes() for p in after.nodes.values()
    )  # the same on every node
    for who, (key, cert) in old.items():
        assert revoked(krl, key, tmp_path) == revoked(krl, cert, tmp_path) == (who in gone), who
    for p in after.nodes.values():  # the keys in use now, and their certificates, pass
        for u in p.ssh_mesh.users:
            if u.identity:
                assert not revoked(krl, u.identity.public, tmp_path) and not revoked(
                    krl, u.certificate, tmp_path
                )
    # The KRL holds a 32-byte hash per revoked key (one section), nothing per node of the cluster.
    assert len(after.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys) == len(
        before.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys
    ) + 1 + 4 + len(gone) * (4 + 32)


def test_two_plans_of_the_same_key_store_write_the_same_krl_so_a_rerun_changes_nothing(tmp_path):
    cluster = parse_cluster(MIXED)
    first, second = plan_of(cluster, tmp_path / "keys"), plan_of(cluster, tmp_path / "keys")
    assert (
        first.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys
        == second.nodes["gpu-b02"].ssh_mesh.sshd.revoked_keys
    )
    KeyStore("mix", root=tmp_path / "keys").revoke("root", "gpu-a01")
    third, fourth = plan_of(cluster, tmp_path / "keys"), plan_of(cluster, tmp_path / "keys")
    assert (
        third.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys
        == fourth.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys
        != first.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys
    )


# -- keys or certificates -----------------------------------------------------------------------


def test_a_key_mesh_plans_every_nodes_keys_and_no_certificate(tmp_path):
    cluster = parse_cluster(MIXED + "ssh: {mesh: keys}\n")
    host_keys = {n.name: [public_key()] for n in cluster.nodes}
    plan = plan_of(cluster, tmp_path / "keys", host_keys=host_keys)
    store = KeyStore("mix", root=tmp_path / "keys")
    for node_plan in plan.nodes.values():
        assert len(node_plan.ssh_mesh.known_hosts) == 4 and not any(
            line.startswith("@") for line in node_plan.ssh_mesh.known_hosts
        )
        assert node_plan.ssh_mesh.sshd == SshdPlan(certificates={}, drop_in=None, revoked_keys=None)
        for user in node_plan.ssh_mesh.users:
            assert user.certificate is None
            assert user.authorized == [
                store.keypair(user.user, n.name).public for n in cluster.nodes
            ]
    assert not (store.dir / ".ca").exists()  # a key mesh never makes the CA


def mesh_file_sizes(plan: ClusterPlan) -> set[int]:
    """Per node, the bytes of its known_hosts block, authorized_keys block and ssh config block."""
    return {
        sum(len(line) + 1 for line in [*p.ssh_mesh.known_hosts, *u.authorized, *u.config])
        for p in plan.nodes.values()
        for u in p.ssh_mesh.users
    }


def test_a_certificate_meshs_files_are_the_same_size_for_3_and_300_nodes_and_a_key_meshs_grow(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(
        keystore.os, "fsync", lambda fd: None
    )  # 300 new keys: durability is not the point here
    sizes = {}
    for mode in ("certificates", "keys"):
        for n in (3, 300):
            cluster = parse_cluster(big_spec(n, mode, ipv6=True))
            plan = plan_of(
                cluster,
                tmp_path / "keys",
                host_keys={c.name: [public_key()] for c in cluster.nodes},
                sshd={c.name: fresh_sshd() for c in cluster.nodes},
            )
            sizes[mode, n] = mesh_file_sizes(plan)
    assert (
        sizes["certificates", 3] == sizes["certificates", 300]
        and len(sizes["certificates", 3]) == 1
    )
    assert min(sizes["keys", 300]) > 50 * max(sizes["keys", 3]) > max(sizes["certificates", 3])


# -- the spec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, key",
    [
        ("ssh: {mesh: bogus}\n", "ssh.mesh"),
        ("ssh: {mesh: Keys}\n", "ssh.mesh"),
        ("ssh: {certificate_days: 0}\n", "ssh.certificate_days"),
        ("ssh: {certificate_days: 3651}\n", "ssh.certificate_days"),
        ("ssh: {certificate_days: thirty}\n", "ssh.certificate_days"),
        ("NODE_SSH: {mesh: keys}", "nodes[0].ssh.mesh"),
        ("NODE_SSH: {certificate_days: 30}", "nodes[0].ssh.certificate_days"),
    ],
)
def test_a_bad_or_misplaced_mesh_setting_is_refused_naming_its_key(extra, key):
    spec = "cluster: {name: p}\nnodes:\n  - {name: a, address: 192.0.2.1}\n"
    if extra.startswith("NODE_SSH: "):
        spec = spec.replace("192.0.2.1}", f"192.0.2.1, ssh: {extra[len('NODE_SSH: ') :]}}}")
    else:
        spec += extra
    with pytest.raises(SpecError) as refused:
        parse_spec(spec)
    assert any(f": {key}: " in problem for problem in refused.value.problems), (
        refused.value.problems
    )


def test_the_mesh_settings_default_to_certificates_for_a_year_and_never_reach_a_nodes_ssh():
    cluster = parse_cluster(
        "cluster: {name: p}\nssh: {port: 2200}\nnodes:\n  - {name: a, address: 192.0.2.1}\n"
    )
    assert (cluster.mesh, cluster.certificate_days) == ("certificates", 365)
    assert cluster.nodes[0].ssh["port"] == 2200 and not {"mesh", "certificate_days"} & set(
        cluster.nodes[0].ssh
    )


# -- what sshd reads: the SshdMesh fact and sshd's part of the plan --------------------------------

CERT_KINDS = ("dsa", "ecdsa", "ed25519", "rsa")


def sshd_fact_output(etc: Path) -> list[str]:
    """SshdMesh's own script run over a fake /etc/ssh at ``etc``; the output names the real
    paths."""
    script = _SSHD_SCRIPT
    for glob in ("/etc/ssh/sshd_config.d/*.conf", "/etc/ssh/ssh_config.d/*.conf"):
        script = script.replace(glob, glob.replace("/etc/ssh", str(etc)))
    assert script.count(str(etc)) == 2
    args = [
        f"{etc}/sshd_config",
        f"{etc}/sshd_config.d/trainfleet-mesh.conf",
        f"{etc}/trainfleet_revoked_keys",
        f"{etc}/ssh_config",
        f"{etc}/ssh_config.d/trainfleet-mesh.conf",
        *(f"{etc}/ssh_host_{kind}_key-cert.pub" for kind in CERT_KINDS),
    ]
    out = subprocess.run(
        ["sh", "-c", script, "trainfleet", *args], capture_output=True, text=True, check=True
    ).stdout

    def real(path: str) -> str:
        return path.replace(f"{etc}/", "/etc/ssh/")

    lines = []
    for line in out.splitlines():
        if line.startswith("file "):
            fields = line.split(" ", 2)
            line = " ".join([fields[0], real(fields[1]), fields[2]])
        elif line.startswith(("revoked_keys_in ", "revoked_host_keys_in ")):
            word, path = line.split(" ", 1)
            line = f"{word} {real(path)}"
        lines.append(line)
    return lines


DEBIAN_SSH_CONFIG = (
    Path(__file__).parent.parent / "fixtures" / "openssh" / "ssh_config.debian12"
).read_text()


def fake_etc(
    tmp_path: Path,
    main: str,
    drop_ins: dict[str, str],
    files: dict[str, bytes],
    client: str = DEBIAN_SSH_CONFIG,
    client_drop_ins: dict[str, str] | None = None,
) -> Path:
    etc = tmp_path / "etc_ssh"
    (etc / "sshd_config.d").mkdir(parents=True)
    (etc / "ssh_config.d").mkdir()
    (etc / "sshd_config").write_text(main)
    (etc / "ssh_config").write_text(client)
    for name, text in drop_ins.items():
        (etc / "sshd_config.d" / name).write_text(text)
    for name, text in (client_drop_ins or {}).items():
        (etc / "ssh_config.d" / name).write_text(text)
    for name, data in files.items():
        (etc / name).write_bytes(data)
    return etc


def test_the_sshd_fact_reads_a_converged_node_and_ignores_trainfleets_own_revoked_keys(tmp_path):
    cert = "ssh-ed25519-cert-v01@openssh.com AAAAC3Nz trainfleet:prod:host:gpu-a01"
    etc = fake_etc(
        tmp_path,
        "Include /etc/ssh/sshd_config.d/*.conf\nKbdInteractiveAuthentication no\n",
        {
            "50-cloud-init.conf": "PasswordAuthentication no\n",
            "trainfleet-mesh.conf": f"HostCertificate {ED25519_CERT}\nRevokedKeys {REVOKED_KEYS}\n",
        },
        {
            "ssh_host_ed25519_key-cert.pub": (cert + "\n").encode(),
            "trainfleet_revoked_keys": b"SSHKRL\n\0\x01",
        },
    )
    found = SshdMesh().process(sshd_fact_output(etc))
    assert found == {
        "includes_drop_ins": True,
        "other_revoked_keys": [],
        "certificates": {
            f"/etc/ssh/ssh_host_{k}_key-cert.pub": cert if k == "ed25519" else None
            for k in CERT_KINDS
        },
        "drop_in": f"HostCertificate {ED25519_CERT}\nRevokedKeys {REVOKED_KEYS}\n".encode(),
        "revoked_keys": b"SSHKRL\n\0\x01",
        "client_includes_drop_ins": True,
        "other_revoked_host_keys": [],
        "client_drop_in": None,
    }


def test_the_sshd_fact_names_an_sshd_config_without_the_include_and_every_other_revoked_keys(
    tmp_path,
):
    etc = fake_etc(
        tmp_path,
        "#Include /etc/ssh/sshd_config.d/*.conf\nRevokedKeys /etc/ssh/site.krl\n",
        {
            "10-site.conf": "  revokedkeys /etc/ssh/other.krl\n",
            "20-fine.conf": "# RevokedKeys none\n",
        },
        {},
    )
    found = SshdMesh().process(sshd_fact_output(etc))
    assert found["includes_drop_ins"] is False
    assert found["other_revoked_keys"] == [
        "/etc/ssh/sshd_config",
        "/etc/ssh/sshd_config.d/10-site.conf",
    ]
    assert found["drop_in"] is None and found["revoked_keys"] is None
    assert set(found["certificates"].values()) == {None}


# ssh_config reads ssh_config.d for every host, or not: where the Include stands decides
# (ssh scopes an included file's lines to the Host/Match block around its Include).
@pytest.mark.parametrize(
    "client, reads",
    [
        (DEBIAN_SSH_CONFIG, True),  # Include first, before Host *
        (
            "# RHEL 9: every line commented, the Include last\n# Host *\n#   ForwardAgent no\n"
            "Include /etc/ssh/ssh_config.d/*.conf\n",
            True,
        ),
        (
            "Host *\n    SendEnv LANG\n  include   ssh_config.d/*.conf\n",
            True,
        ),  # relative to /etc/ssh, in Host *
        ("Match all\nInclude=/etc/ssh/ssh_config.d/*.conf\n", True),
        ("#Include /etc/ssh/ssh_config.d/*.conf\nHost *\n", False),
        (
            "Host gateway\n    User ops\nInclude /etc/ssh/ssh_config.d/*.conf\n",
            False,
        ),  # read for gateway only
        ("Match user alice\nInclude /etc/ssh/ssh_config.d/*.conf\n", False),
        ("Include /etc/ssh/ssh_config.d/site-*.conf\n", False),
    ],
)
def test_the_sshd_fact_says_whether_ssh_config_reads_ssh_config_d_for_every_host(
    tmp_path, client, reads
):
    found = SshdMesh().process(sshd_fact_output(fake_etc(tmp_path, "", {}, {}, client=client)))
    assert found["client_includes_drop_ins"] is reads


def test_the_sshd_fact_names_other_files_setting_revoked_host_keys_and_reads_the_client_drop_in(
    tmp_path,
):
    ours = f"Host *\n    RevokedHostKeys {REVOKED_KEYS}\n"
    etc = fake_etc(
        tmp_path,
        "",
        {},
        {},
        client=DEBIAN_SSH_CONFIG + "Host old\n  RevokedHostKeys /etc/ssh/site.krl\n",
        client_drop_ins={
            "10-site.conf": "revokedhostkeys=/etc/ssh/other.krl\n",
            "20-fine.conf": "# RevokedHostKeys none\n",
            "trainfleet-mesh.conf": ours,
        },
    )
    found = SshdMesh().process(sshd_fact_output(etc))
    assert found["other_revoked_host_keys"] == [
        "/etc/ssh/ssh_config",
        "/etc/ssh/ssh_config.d/10-site.conf",
    ]
    assert found["client_drop_in"] == ours.encode()


@needs_openssh
def test_every_users_ssh_reads_the_client_drop_in_for_names_and_addresses_unless_it_sets_its_own(
    tmp_path,
):
    """OpenSSH's own reading (``ssh -G``) of a system config that includes the rendered drop-in."""
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    (tmp_path / "ssh_config.d").mkdir()
    (tmp_path / "ssh_config.d" / "trainfleet-mesh.conf").write_text(
        plan.nodes["gpu-a01"].ssh_mesh.sshd.client_drop_in
    )
    system = tmp_path / "ssh_config"
    system.write_text(
        DEBIAN_SSH_CONFIG.replace("/etc/ssh/ssh_config.d/", f"{tmp_path}/ssh_config.d/")
    )

    def revoked_host_keys(host: str, *configs: Path) -> str:
        text = "".join(
            f"Include {c}\n" for c in configs
        )  # -F reads one file: the user's, then the system's
        (tmp_path / "run_config").write_text(text)
        out = subprocess.run(
            ["ssh", "-G", "-F", str(tmp_path / "run_config"), host],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return next(
            line.split(" ", 1)[1]
            for line in out.splitlines()
            if line.startswith("revokedhostkeys ")
        )

    for host in ("gpu-a01", "198.18.0.11", "gpu-a02.cluster.example.com", "unrelated.example.org"):
        assert revoked_host_keys(host, system) == REVOKED_KEYS
    own = tmp_path / "user_config"  # a user's own RevokedHostKeys: ssh reads the first one it finds
    own.write_text("RevokedHostKeys ~/.ssh/my.krl\n")
    assert revoked_host_keys("198.18.0.11", own, system).endswith("/.ssh/my.krl")


def test_sshd_fact_output_without_the_include_answer_or_a_file_is_an_error_not_a_fresh_node(
    tmp_path,
):
    lines = sshd_fact_output(fake_etc(tmp_path, "Include /etc/ssh/sshd_config.d/*.conf\n", {}, {}))
    assert SshdMesh().process(lines)["includes_drop_ins"] is True
    with pytest.raises(FactProcessError):
        SshdMesh().process([line for line in lines if not line.startswith("include ")])
    with pytest.raises(FactProcessError):
        SshdMesh().process([line for line in lines if not line.startswith("file krl ")])
    for gone in ("client_include ", "file client_drop_in "):
        with pytest.raises(FactProcessError):
            SshdMesh().process([line for line in lines if not line.startswith(gone)])
    with pytest.raises(FactProcessError):
        SshdMesh().process([])


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"includes_drop_ins": False}, "does not read /etc/ssh/sshd_config.d/*.conf"),
        (
            {"other_revoked_keys": ["/etc/ssh/sshd_config.d/10-site.conf"]},
            "10-site.conf sets RevokedKeys",
        ),
        (
            {"client_includes_drop_ins": False},
            "/etc/ssh/ssh_config does not read /etc/ssh/ssh_config.d/*.conf for every",
        ),
        (
            {"other_revoked_host_keys": ["/etc/ssh/ssh_config"]},
            "/etc/ssh/ssh_config sets RevokedHostKeys",
        ),
        ({"sshd": None}, "could not be read"),
        ({"host_keys": []}, "could not be read"),
        (
            {
                "certificates": {
                    ED25519_CERT: "ssh-ed25519-cert-v01@openssh.com AAAA site-ca:gpu-a01"
                }
            },
            "holds a host certificate trainfleet did not sign (site-ca:gpu-a01)",
        ),
    ],
)
def test_a_node_whose_sshd_would_not_read_the_mesh_files_carries_the_problem_and_no_files(
    tmp_path, change, problem
):
    cluster = parse_cluster(MIXED)
    node = cluster.node("gpu-a01")
    sshd = {**fresh_sshd(), **{k: v for k, v in change.items() if k not in ("sshd", "host_keys")}}
    gathered = Gathered(
        host_keys={"gpu-a01": change.get("host_keys", [public_key()])},
        sshd={} if "sshd" in change else {"gpu-a01": sshd},
    )
    certs = plan_certificates(cluster, prepared(KeyStore("mix", root=tmp_path / "keys"), cluster))
    part = sshd_part(cluster, node, gathered, certs)
    assert (part.certificates, part.drop_in, part.revoked_keys) == ({}, None, None)
    assert len(part.problems) == 1 and problem in part.problems[0]
    commands, _ = run_op(
        sshd_certificates,
        [(SshdMesh, {}, sshd)],
        certificates=part.certificates,
        drop_in=part.drop_in,
        revoked_keys=part.revoked_keys,
        problems=part.problems,
    )
    assert len(commands) == 1 and isinstance(commands[0], FailCommand)
    assert (
        problem in commands[0].get_raw_value()
        and "nothing was changed" in commands[0].get_raw_value()
    )


# -- the operations, at the generator level ------------------------------------------------------


def run_op(op, facts: list[tuple[type, dict, Any]], **kwargs: Any) -> tuple[list, str | None]:
    """The commands ``op`` yields on a node whose facts this run read are ``facts``
    ([(fact class, its arguments, value)]), and its no-op message."""
    state = FakeState()
    host = create_host(state, name="gpu-a01", facts={})
    run_facts(state).read[host.name] = {_key(cls, args): value for cls, args, value in facts}
    with ctx_state.use(state), ctx_host.use(host):
        commands = list(op._inner(**kwargs))
    return commands, host.noop_description


def written(command) -> tuple[str, str, bytes]:
    """(path, the sha256 or state the node must still hold, the new bytes) of an inline write."""
    words = shlex.split(command.get_raw_value())
    env = dict(w.split("=", 1) for w in words if w.startswith("TF_") and "=" in w)
    return words[-4], words[-3], base64.b64decode(env["TF_DATA"])


def is_reload(command) -> bool:
    return "sshd -t" in command.get_raw_value() and "systemctl reload" in command.get_raw_value()


def sshd_args(plan: ClusterPlan, node: str = "gpu-a01") -> dict[str, Any]:
    sshd = plan.nodes[node].ssh_mesh.sshd
    return {
        "certificates": sshd.certificates,
        "drop_in": sshd.drop_in,
        "revoked_keys": sshd.revoked_keys,
        "problems": sshd.problems,
        "client_drop_in": sshd.client_drop_in,
    }


def converged_sshd(plan: ClusterPlan, node: str = "gpu-a01") -> dict[str, Any]:
    sshd = plan.nodes[node].ssh_mesh.sshd
    return {
        **fresh_sshd(),
        "certificates": {
            **{f"/etc/ssh/ssh_host_{k}_key-cert.pub": None for k in CERT_KINDS},
            **{p: line.strip() for p, line in sshd.certificates.items()},
        },
        "drop_in": sshd.drop_in.encode(),
        "revoked_keys": sshd.revoked_keys,
        "client_drop_in": sshd.client_drop_in.encode(),
    }


def test_sshd_certificates_writes_certificates_then_krl_then_drop_ins_then_reloads_sshd_once(
    tmp_path,
):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    commands, _ = run_op(sshd_certificates, [(SshdMesh, {}, fresh_sshd())], **sshd_args(plan))
    *writes, reload = commands
    sshd = plan.nodes["gpu-a01"].ssh_mesh.sshd
    assert [written(c)[0] for c in writes] == [
        ED25519_CERT,
        REVOKED_KEYS,
        SSHD_MESH_CONF,
        SSH_MESH_CONF,
    ]
    assert is_reload(reload)
    assert [written(c)[2] for c in writes] == [
        sshd.certificates[ED25519_CERT].encode(),
        sshd.revoked_keys,
        sshd.drop_in.encode(),
        sshd.client_drop_in.encode(),
    ]
    assert (
        f"HostCertificate {ED25519_CERT}\n" in sshd.drop_in
        and f"RevokedKeys {REVOKED_KEYS}\n" in sshd.drop_in
    )
    assert f"Host *\n    RevokedHostKeys {REVOKED_KEYS}\n" in sshd.client_drop_in


def test_a_node_without_the_client_drop_in_gets_it_alone_and_sshd_is_not_reloaded(tmp_path):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    commands, _ = run_op(
        sshd_certificates,
        [(SshdMesh, {}, {**converged_sshd(plan), "client_drop_in": None})],
        **sshd_args(plan),
    )
    assert [written(c)[0] for c in commands] == [SSH_MESH_CONF]


def test_sshd_certificates_changes_nothing_on_a_node_that_holds_the_plans_files(tmp_path):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    commands, noop = run_op(
        sshd_certificates, [(SshdMesh, {}, converged_sshd(plan))], **sshd_args(plan)
    )
    assert commands == [] and noop


def test_sshd_certificates_writes_a_renewed_certificate_alone_and_reloads(tmp_path):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    current = converged_sshd(plan)
    current["certificates"][ED25519_CERT] = (
        "ssh-ed25519-cert-v01@openssh.com AAAAold trainfleet:mix:host:gpu-a01"
    )
    commands, _ = run_op(sshd_certificates, [(SshdMesh, {}, current)], **sshd_args(plan))
    assert [written(c)[0] for c in commands[:-1]] == [ED25519_CERT] and is_reload(commands[-1])


ECDSA_CERT = "/etc/ssh/ssh_host_ecdsa_key-cert.pub"


def _public_of(kind: str) -> str:
    """A fresh ECDSA (P-256) or RSA public key line."""
    key = {
        "ecdsa": lambda: ec.generate_private_key(ec.SECP256R1()),
        "rsa": lambda: rsa.generate_private_key(65537, 2048),
    }[kind]().public_key()
    return key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


@pytest.mark.parametrize(
    "kinds, certified",
    [
        (
            ("ecdsa", "ed25519", "rsa"),
            ED25519_CERT,
        ),  # Debian's three host keys: the ed25519 one only
        (("ecdsa", "rsa"), RSA_CERT),  # no ed25519: RSA
    ],
)
def test_the_ca_certifies_one_host_key_ed25519_else_rsa_and_sshd_names_only_its_certificate(
    tmp_path, kinds, certified
):
    cluster = parse_cluster(MIXED)
    keys = {kind: (public_key() if kind == "ed25519" else _public_of(kind)) for kind in kinds}
    plan = plan_of(
        cluster, tmp_path / "keys", host_keys={n.name: sorted(keys.values()) for n in cluster.nodes}
    )
    sshd = plan.nodes["gpu-a01"].ssh_mesh.sshd
    assert list(sshd.certificates) == [certified] and not sshd.problems
    assert [line for line in sshd.drop_in.splitlines() if line.startswith("HostCertificate")] == [
        f"HostCertificate {certified}"
    ]
    kind = "ed25519" if certified == ED25519_CERT else "rsa"
    assert certificates.read(sshd.certificates[certified]).key == " ".join(keys[kind].split()[:2])


def test_a_node_with_only_an_ecdsa_host_key_gets_no_certificate_and_fails_its_step(tmp_path):
    cluster = parse_cluster(MIXED)
    plan = plan_of(
        cluster, tmp_path / "keys", host_keys={n.name: [_public_of("ecdsa")] for n in cluster.nodes}
    )
    sshd = plan.nodes["gpu-a01"].ssh_mesh.sshd
    assert sshd.certificates == {} and "no ed25519 (or RSA) host key" in sshd.problems[0]


def test_trainfleets_certificate_of_another_host_key_is_unnamed_then_removed_after_the_reload(
    tmp_path,
):
    """A node an older deploy gave an ECDSA host certificate too: the drop-in without it, sshd
    reloaded, then the file removed; a site's own certificate is not trainfleet's to remove."""
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    current = converged_sshd(plan)
    old = plan_certificates(
        parse_cluster(MIXED),
        prepared(KeyStore("mix", root=tmp_path / "keys"), parse_cluster(MIXED)),
    )
    current["certificates"][ECDSA_CERT] = old.certificate(
        None, _public_of("ecdsa"), "host", ["gpu-a01"], "trainfleet:mix:host:gpu-a01"
    )
    current["drop_in"] = (
        plan.nodes["gpu-a01"]
        .ssh_mesh.sshd.drop_in.replace(
            "HostCertificate", f"HostCertificate {ECDSA_CERT}\nHostCertificate", 1
        )
        .encode()
    )
    commands, _ = run_op(sshd_certificates, [(SshdMesh, {}, current)], **sshd_args(plan))
    write, reload, remove = commands
    assert written(write)[0] == SSHD_MESH_CONF and is_reload(reload)
    assert shlex.split(remove.get_raw_value()) == ["rm", "-f", "--", ECDSA_CERT]
    # Only the stale file left (its removal failed last time): removed, no reload needed.
    current = {
        **converged_sshd(plan),
        "certificates": {
            **converged_sshd(plan)["certificates"],
            ECDSA_CERT: current["certificates"][ECDSA_CERT],
        },
    }
    commands, _ = run_op(sshd_certificates, [(SshdMesh, {}, current)], **sshd_args(plan))
    assert [shlex.split(c.get_raw_value()) for c in commands] == [["rm", "-f", "--", ECDSA_CERT]]


def test_a_key_mesh_drops_the_drop_in_reloads_then_removes_only_trainfleets_certificates_and_krl(
    tmp_path,
):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    current = converged_sshd(plan)
    site_ca = plan_certificates(
        parse_cluster(MIXED),
        prepared(KeyStore("mix", root=tmp_path / "site"), parse_cluster(MIXED)),
    )
    current["certificates"][RSA_CERT] = site_ca.certificate(
        None, public_key(), "host", ["gpu-a01"], "site-ca"
    )
    current["certificates"]["/etc/ssh/ssh_host_ecdsa_key-cert.pub"] = current["certificates"][
        RSA_CERT
    ].rsplit(" ", 1)[0]
    commands, _ = run_op(
        sshd_certificates,
        [(SshdMesh, {}, current)],
        certificates={},
        drop_in=None,
        revoked_keys=None,
    )
    remove_client, remove_drop_in, reload, remove_files = commands
    assert shlex.split(remove_client.get_raw_value()) == [
        "rm",
        "-f",
        "--",
        SSH_MESH_CONF,
    ]  # before the KRL it names
    assert shlex.split(remove_drop_in.get_raw_value()) == ["rm", "-f", "--", SSHD_MESH_CONF]
    assert is_reload(reload)
    assert shlex.split(remove_files.get_raw_value()) == [
        "rm",
        "-f",
        "--",
        ED25519_CERT,
        REVOKED_KEYS,
    ]
    # A key mesh on a node that never had the certificate mesh: nothing to do.
    assert (
        run_op(
            sshd_certificates,
            [(SshdMesh, {}, fresh_sshd())],
            certificates={},
            drop_in=None,
            revoked_keys=None,
        )[0]
        == []
    )


def test_a_key_mesh_removes_trainfleets_certificates_and_krl_left_behind_without_the_drop_in(
    tmp_path,
):
    plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    current = {**converged_sshd(plan), "drop_in": None}  # removed, then the reload failed
    commands, _ = run_op(
        sshd_certificates,
        [(SshdMesh, {}, current)],
        certificates={},
        drop_in=None,
        revoked_keys=None,
    )
    assert ["rm", "-f", "--", ED25519_CERT, REVOKED_KEYS] in [
        shlex.split(c.get_raw_value()) for c in commands
    ]


# mesh_user / mesh_trust: a mesh moving from keys to certificates


def regular(text: str, link: bool = False) -> dict:
    return {"state": "regular", "link": link, "data": text.encode()}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


USERS_OWN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOwnkey alice@laptop\n"


def alice_on_node(
    user_plan, authorized_block: list[str], certificate: str | None, link: bool = False
) -> dict:
    """alice's SshMeshUser fact on a node holding her key, ``authorized_block`` after her own line,
    and the plan's ssh config."""
    authorized = USERS_OWN + with_block(
        split_block("", AUTHORIZED_PURPOSE), AUTHORIZED_PURPOSE, authorized_block
    )
    config = with_block(split_block("", CONFIG_PURPOSE), CONFIG_PURPOSE, user_plan.config, top=True)
    return {
        "exists": True,
        "home": "/home/alice",
        "group": "alice",
        "uid": "1000",
        "ssh_dir": {"mode": "700", "owner": "alice", "sha256": None},
        "identity": {"mode": "600", "owner": "alice", "sha256": sha(user_plan.identity.private)},
        "identity_pub": {
            "mode": "644",
            "owner": "alice",
            "sha256": sha(user_plan.identity.public + "\n"),
        },
        "authorized": block_state(regular(authorized, link), AUTHORIZED_PURPOSE),
        "config": block_state(regular(config), CONFIG_PURPOSE),
        "certificate": certificate,
    }


def keys_then_certificates(tmp_path: Path):
    """alice's plans on gpu-a01 in a key mesh and then in a certificate mesh of the same key
    store."""
    keys_plan = plan_of(parse_cluster(MIXED + "ssh: {mesh: keys}\n"), tmp_path / "keys")
    cert_plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    return keys_plan.nodes["gpu-a01"].ssh_mesh.users[1], cert_plan.nodes["gpu-a01"].ssh_mesh.users[
        1
    ]


def mesh_steps(fact_value: dict, user_plan) -> tuple[list, list]:
    """The deploy's steps for a mesh user, all from the facts read before the run: mesh_trust
    adding the new lines, then mesh_user (identity, certificate, config) -> ``added``; then
    mesh_trust leaving exactly the plan's lines -> ``trusted``."""
    facts = [(SshMeshUser, {"user": "alice"}, fact_value)]
    adding, _ = run_op(
        mesh_trust, facts, user="alice", authorized=user_plan.authorized, exactly=False
    )
    user, _ = run_op(
        mesh_user,
        facts,
        user="alice",
        identity=user_plan.identity,
        config=user_plan.config,
        certificate=user_plan.certificate,
    )
    trusted, _ = run_op(
        mesh_trust,
        facts,
        user="alice",
        authorized=user_plan.authorized,
        certificate=user_plan.certificate,
    )
    return adding + user, trusted


def test_moving_to_certificates_the_ca_line_is_added_first_and_then_kept_alone(tmp_path):
    keys_user, cert_user = keys_then_certificates(tmp_path)
    assert keys_user.identity == cert_user.identity and keys_user.user == "alice"
    added, trusted = mesh_steps(alice_on_node(cert_user, keys_user.authorized, None), cert_user)

    authorized, cert = (written(c) for c in added)  # trust first, then the certificate
    assert (
        cert[0] == "/home/alice/.ssh/id_trainfleet-cert.pub"
        and cert[2] == cert_user.certificate.encode()
    )
    assert authorized[0] == "/home/alice/.ssh/authorized_keys"
    during = split_block(authorized[2].decode(), AUTHORIZED_PURPOSE)
    assert during.block == [
        *keys_user.authorized,
        *cert_user.authorized,
    ]  # both trusted while nodes move
    assert authorized[2].decode().startswith(USERS_OWN)

    (final,) = trusted
    path, expected, data = written(final)
    assert (
        path == authorized[0] and expected == hashlib.sha256(authorized[2]).hexdigest()
    )  # chained on the adding run
    assert split_block(data.decode(), AUTHORIZED_PURPOSE).block == cert_user.authorized
    assert data.decode().startswith(USERS_OWN)


def test_a_converged_certificate_mesh_user_changes_nothing(tmp_path):
    _, cert_user = keys_then_certificates(tmp_path)
    added, trusted = mesh_steps(
        alice_on_node(cert_user, cert_user.authorized, cert_user.certificate.strip()), cert_user
    )
    assert added == [] and trusted == []


def test_moving_back_to_keys_mesh_trust_drops_the_ca_line_and_removes_the_certificate(tmp_path):
    keys_user, cert_user = keys_then_certificates(tmp_path)
    current = alice_on_node(keys_user, cert_user.authorized, cert_user.certificate.strip())
    added, trusted = mesh_steps(current, keys_user)
    (authorized,) = (written(c) for c in added)  # the certificate is left to the final mesh_trust
    assert split_block(authorized[2].decode(), AUTHORIZED_PURPOSE).block == [
        *cert_user.authorized,
        *keys_user.authorized,
    ]
    final, remove = trusted
    assert written(final)[1] == hashlib.sha256(authorized[2]).hexdigest()
    assert split_block(written(final)[2].decode(), AUTHORIZED_PURPOSE).block == keys_user.authorized
    assert shlex.split(remove.get_raw_value())[-1] == "/home/alice/.ssh/id_trainfleet-cert.pub"


def test_moving_to_certificates_trust_chains_on_its_adding_run_via_a_users_linked_authorized_keys(
    tmp_path,
):
    keys_user, cert_user = keys_then_certificates(tmp_path)
    added, trusted = mesh_steps(
        alice_on_node(cert_user, keys_user.authorized, None, link=True), cert_user
    )
    (authorized,) = [written(c) for c in added if written(c)[0].endswith("/authorized_keys")]
    assert written(trusted[0])[1] == hashlib.sha256(authorized[2]).hexdigest()


def test_a_fresh_user_gets_the_certificate_and_the_ca_line_in_one_write_each(tmp_path):
    _, cert_user = keys_then_certificates(tmp_path)
    fresh = alice_on_node(cert_user, [], None)
    fresh["authorized"] = block_state(
        {"state": "missing", "link": False, "data": None}, AUTHORIZED_PURPOSE
    )
    added, trusted = mesh_steps(fresh, cert_user)
    writes = [written(c) for c in added]
    assert [w[0].rsplit("/", 1)[1] for w in writes] == ["authorized_keys", "id_trainfleet-cert.pub"]
    assert writes[0][1] == ABSENT
    assert split_block(writes[0][2].decode(), AUTHORIZED_PURPOSE).block == cert_user.authorized
    assert trusted == []  # the adding run already wrote exactly the final block


# -- what the review found (issue #18) -----------------------------------------------------------


def test_a_forged_certificate_with_times_out_of_range_is_read_clamped_not_a_crash(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        SSHCertificateBuilder,
        SSHCertificateType,
    )

    forger = (
        Ed25519PrivateKey.generate()
    )  # any key: a user can sign what lands in the user's own home
    forged = (
        SSHCertificateBuilder()
        .public_key(forger.public_key())
        .serial(1)
        .type(SSHCertificateType.USER)
        .key_id(b"x")
        .valid_principals([b"alice"])
        .valid_after(2**64 - 2)
        .valid_before(2**64 - 1)
        .sign(forger)
        .public_bytes()
        .decode()
    )
    assert certificates.read(forged).valid_after.year == 9999  # read, clamped: no OverflowError
    assert mesh.certificate_summary(forged).startswith("user alice until 9999-12-31")
    cluster = parse_cluster(MIXED)
    plan = plan_of(cluster, tmp_path / "keys", user_certificates={"gpu-a01": {"alice": forged}})
    assert (
        plan.nodes["gpu-a01"].ssh_mesh.users[1].certificate != forged
    )  # signed anew, the run goes on
    del serialization


def test_a_revoked_key_leaves_the_block_at_once_even_while_the_mesh_trusts_both_ways(tmp_path):
    from operations.ssh_mesh_ops import trusting

    keys_plan = plan_of(parse_cluster(MIXED + "ssh: {mesh: keys}\n"), tmp_path / "keys")
    lines = keys_plan.nodes["gpu-a01"].ssh_mesh.users[0].authorized
    KeyStore("mix", root=tmp_path / "keys").revoke("root", "gpu-a02")
    cert_plan = plan_of(parse_cluster(MIXED), tmp_path / "keys")
    user = cert_plan.nodes["gpu-a01"].ssh_mesh.users[0]
    current = block_state(
        {
            "state": "regular",
            "link": False,
            "data": with_block(
                split_block("", AUTHORIZED_PURPOSE), AUTHORIZED_PURPOSE, lines
            ).encode(),
        },
        AUTHORIZED_PURPOSE,
    )
    moving = trusting(current, user.authorized, user.refused)
    assert lines[1] not in moving and [lines[0], *lines[2:]] + user.authorized == moving


def test_a_new_ca_moves_only_in_a_run_that_reaches_every_node_and_settles_once_all_present_it(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    store = KeyStore("mix", root=tmp_path / "keys")
    first = plan_of(cluster, tmp_path / "keys")
    store.rotate_certificate_authority()
    assert store.ca_moving()
    # A partial run (one node not read): every node's sshd step fails, nothing moves.
    gathered = gathered_for(cluster)
    partial = Gathered(
        host_keys=gathered.host_keys,
        sshd={n: s for n, s in gathered.sshd.items() if n != "gpu-b02"},
    )
    plan = planned(cluster, partial, store)
    assert all(
        any("deploy the whole cluster at once" in why for why in p.ssh_mesh.sshd.problems)
        for p in plan.nodes.values()
    )
    # A whole run moves them; once every node presents the new CA's certificates, the mark goes.
    whole = plan_of(cluster, tmp_path / "keys")
    assert store.ca_moving() and whole.nodes["gpu-a01"].ssh_mesh.sshd.problems == []
    held = {
        name: {
            **fresh_sshd(),
            "certificates": {
                path: line.strip() for path, line in p.ssh_mesh.sshd.certificates.items()
            },
        }
        for name, p in whole.nodes.items()
    }
    users = {
        name: {u.user: u.certificate.strip() for u in p.ssh_mesh.users}
        for name, p in whole.nodes.items()
    }
    planned(
        cluster, Gathered(host_keys=gathered.host_keys, sshd=held, user_certificates=users), store
    )
    assert not store.ca_moving()
    assert (
        first.nodes["gpu-a01"].ssh_mesh.known_hosts != whole.nodes["gpu-a01"].ssh_mesh.known_hosts
    )


def test_a_ca_rotation_with_a_node_down_completes_once_it_leaves_the_spec_and_the_old_key_goes(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    store = KeyStore("mix", root=tmp_path / "keys")
    plan_of(cluster, tmp_path / "keys")
    old = store.rotate_certificate_authority()
    assert (old / "ca").exists()
    # gpu-b02 is down: with it in the spec nothing moves (see above); out of the spec, the rest
    # move.
    smaller = parse_cluster(
        MIXED.replace('  - {name: gpu-b02, address: "2001:db8::b2", ssh: {port: 2222}}\n', "")
    )
    moved = plan_of(smaller, tmp_path / "keys")
    assert all(
        p.ssh_mesh.sshd.problems == [] and p.ssh_mesh.sshd.certificates
        for p in moved.nodes.values()
    )
    held = {
        name: {
            **fresh_sshd(),
            "certificates": {
                path: line.strip() for path, line in p.ssh_mesh.sshd.certificates.items()
            },
        }
        for name, p in moved.nodes.items()
    }
    users = {
        name: {u.user: u.certificate.strip() for u in p.ssh_mesh.users}
        for name, p in moved.nodes.items()
    }
    planned(smaller, gathered_for(smaller, sshd=held, user_certificates=users), store)
    # Settled: partial runs are safe again, and nothing can sign with the old CA any more.
    assert not store.ca_moving()
    assert not (old / "ca").exists() and (old / "ca.pub").exists()
    # gpu-b02 back (its host key readmitted by the operator): it is planned certificates of the new
    # CA.
    store.readmit_host_keys("gpu-b02", [host_key_of(cluster, "gpu-b02")])
    back = plan_of(cluster, tmp_path / "keys")
    (cert,) = back.nodes["gpu-b02"].ssh_mesh.sshd.certificates.values()
    assert back.nodes["gpu-b02"].ssh_mesh.sshd.problems == [] and mesh.signed_by(
        cert.strip(), store.certificate_authority().public
    )


def test_an_sshd_that_cannot_present_certificates_fails_before_any_node_changes_what_it_presents(
    tmp_path, monkeypatch
):
    from tests.unit.test_plan import deploy_order, three_node_plan

    cluster, _ = three_node_plan(tmp_path)
    sshd = {n.name: fresh_sshd() for n in cluster.nodes}
    sshd["gpu-a03"]["includes_drop_ins"] = False  # a RHEL 8 sshd_config
    plan = planned(
        cluster,
        Gathered(host_keys={n.name: [public_key()] for n in cluster.nodes}, sshd=sshd),
        KeyStore(cluster.name, root=tmp_path / "keys"),
    )
    order = [
        (op.split(".")[1], kwargs)
        for op, kwargs in deploy_order(monkeypatch, cluster, "gpu-a03", plan)
    ]
    ops = [op for op, _ in order]
    sshd_at = ops.index("sshd_certificates")
    assert "does not read /etc/ssh/sshd_config.d" in order[sshd_at][1]["problems"][0]
    assert sshd_at < ops.index("mesh_user")  # fails before anything presents a certificate...
    # ... and the steps that drop the old trust wait for a run without a failed node.
    assert all(
        kwargs.get("_if") is not None
        for op, kwargs in order
        if kwargs.get("exactly", True) and op in ("known_hosts", "mesh_trust")
    )


def test_a_reimaged_or_removed_nodes_old_host_keys_are_revoked_so_their_certificates_are_refused(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    root = tmp_path / "keys"
    old_key = host_key_of(cluster, "gpu-a02")
    plan_of(cluster, root)
    assert (
        KeyStore("mix", root=root).revoked_keys() == []
    )  # a re-run with the same host keys revokes nothing
    plan = plan_of(
        cluster,
        root,
        host_keys={
            **{n.name: [host_key_of(cluster, n.name)] for n in cluster.nodes},
            "gpu-a02": [public_key()],
        },
    )  # gpu-a02 reimaged
    assert refused_keys(root) == [old_key]
    (tmp_path / "krl").write_bytes(plan.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys)
    assert revoked(tmp_path / "krl", old_key, tmp_path)
    assert (
        "    RevokedHostKeys /etc/ssh/trainfleet_revoked_keys"
        in plan.nodes["gpu-a01"].ssh_mesh.users[0].config
    )
    smaller = parse_cluster(
        MIXED.replace('  - {name: gpu-b02, address: "2001:db8::b2", ssh: {port: 2222}}\n', "")
    )
    plan_of(smaller, root)
    assert host_key_of(cluster, "gpu-b02") in refused_keys(root)  # removed from the spec


def test_identities_change_only_without_failures_while_a_node_trusts_another_way(tmp_path):
    cluster = parse_cluster(MIXED)
    keys_plan = plan_of(parse_cluster(MIXED + "ssh: {mesh: keys}\n"), tmp_path / "keys")
    cert_plan = plan_of(cluster, tmp_path / "keys")
    base = gathered_for(cluster)

    def trusting_now(known: list[str] | None, root: list[str] | None) -> dict:
        return {
            n.name: {"/etc/ssh/ssh_known_hosts": known, "root": root, "alice": None}
            for n in cluster.nodes
        }

    def plan_with(trust: dict):
        plan = planned(
            cluster, dataclasses.replace(base, trust=trust), KeyStore("mix", root=tmp_path / "keys")
        )
        node = plan.nodes["gpu-a01"]
        return (
            node.ssh_mesh.sshd.moving,
            node.ssh_mesh.users[0].moving,
            node.ssh_mesh.users[1].moving,
        )

    a01 = keys_plan.nodes["gpu-a01"]
    # A key mesh moving to certificates: hosts and root are moving, alice (no block yet) is not.
    assert plan_with(trusting_now(a01.ssh_mesh.known_hosts, a01.ssh_mesh.users[0].authorized)) == (
        True,
        True,
        False,
    )
    # New nodes: nothing works yet that could be cut.
    assert plan_with(trusting_now(None, None)) == (False, False, False)
    # Converged, or trusting both ways already: nothing moves.
    c01 = cert_plan.nodes["gpu-a01"]
    assert plan_with(trusting_now(c01.ssh_mesh.known_hosts, c01.ssh_mesh.users[0].authorized)) == (
        False,
        False,
        False,
    )
    assert plan_with(
        trusting_now(
            a01.ssh_mesh.known_hosts + c01.ssh_mesh.known_hosts,
            a01.ssh_mesh.users[0].authorized + c01.ssh_mesh.users[0].authorized,
        )
    ) == (False, False, False)


def test_a_node_removed_then_added_back_as_it_was_is_named_until_the_operator_readmits_its_host_key(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    root = tmp_path / "keys"
    plan_of(cluster, root)
    smaller = parse_cluster(
        MIXED.replace('  - {name: gpu-b02, address: "2001:db8::b2", ssh: {port: 2222}}\n', "")
    )
    plan_of(smaller, root)
    key = host_key_of(cluster, "gpu-b02")
    assert key in refused_keys(root)
    plan = plan_of(cluster, root)  # back, with the host key it had: still revoked, the node named
    assert key in refused_keys(root)
    (why,) = plan.nodes["gpu-b02"].ssh_mesh.sshd.problems
    assert (
        f"presents the host key {certificates.fingerprint(key)}" in why
        and "keys readmit SPEC gpu-b02" in why
    )
    assert (
        plan.nodes["gpu-b02"].ssh_mesh.sshd.certificates == {}
        and plan.nodes["gpu-a01"].ssh_mesh.sshd.problems == []
    )
    (tmp_path / "krl").write_bytes(plan.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys)
    assert revoked(tmp_path / "krl", key, tmp_path)
    KeyStore("mix", root=root).readmit_host_keys("gpu-b02", [key])  # the operator's word
    plan = plan_of(cluster, root)
    assert key not in refused_keys(root) and plan.nodes["gpu-b02"].ssh_mesh.sshd.problems == []
    (tmp_path / "krl").write_bytes(plan.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys)
    assert not revoked(tmp_path / "krl", key, tmp_path)


def refused_keys(root: Path) -> list[str]:
    """``type base64`` of every key the store's revoked list holds."""
    return [" ".join(line.split()[:2]) for line in KeyStore("mix", root=root).revoked_keys()]


# -- certificates are verified (issue #26) ---------------------------------------------------------


def test_a_damaged_or_foreign_host_certificate_is_signed_anew_by_the_deploy_and_named_by_drift(
    tmp_path,
):
    cluster = parse_cluster(MIXED)
    first = plan_of(cluster, tmp_path / "keys").nodes["gpu-a01"].ssh_mesh.sshd
    good = first.certificates[ED25519_CERT].strip()
    names = host_principals(cluster.node("gpu-a01"))
    kind, blob = good.split()[:2]
    data = bytearray(base64.b64decode(blob))
    data[-10] ^= 1  # inside the signature
    key = host_key_of(cluster, "gpu-a01")
    other_ca = plan_certificates(
        cluster, prepared(KeyStore("mix", root=tmp_path / "other"), cluster)
    )
    ca = plan_certificates(cluster, prepared(KeyStore("mix", root=tmp_path / "keys"), cluster))
    bad = {
        "damaged": f"{kind} {base64.b64encode(bytes(data)).decode()} trainfleet:mix:host:gpu-a01",
        "another CA": other_ca.certificate(None, key, "host", names, "trainfleet:mix:host:gpu-a01"),
        "a user certificate": ca.certificate(
            None, key, "user", names, "trainfleet:mix:host:gpu-a01"
        ),
    }
    for why, line in bad.items():
        sshd = {
            n.name: {
                **fresh_sshd(),
                "certificates": {ED25519_CERT: line if n.name == "gpu-a01" else None},
            }
            for n in cluster.nodes
        }
        again = plan_of(cluster, tmp_path / "keys", sshd=sshd).nodes["gpu-a01"].ssh_mesh.sshd
        new = again.certificates[ED25519_CERT].strip()
        assert new != line, why  # the deploy writes it anew...
        assert certificates.problem(new, ca.ca_public, "host", names) is None, why
        # ...and drift, which compares what the node holds with the plan, names it.
        assert mesh.host_certificates_summary(
            {ED25519_CERT: line}
        ) != mesh.host_certificates_summary(again.certificates), why
    assert mesh.certificate_summary(bad["damaged"]).startswith("BAD SIGNATURE: host gpu-a01,")
    assert mesh.certificate_summary(good).startswith("host gpu-a01,")


def test_a_node_down_at_the_first_deploy_of_new_servers_changes_no_krl_when_it_is_back(tmp_path):
    """Issue #38: the store vouched for gpu-b02's host key in the cluster's earlier life; new
    servers are deployed with gpu-b02 down. The controller's known_hosts lists gpu-b02's new key,
    so its old one is revoked in that first run (and drift expects it), not in the run that reads
    gpu-b02 again: that run plans every node the KRL the first one wrote."""
    known = tmp_path / "known_hosts"
    cluster = parse_cluster(MIXED + f"ssh: {{known_hosts: {known}}}\n")
    names = [n.name for n in cluster.nodes]
    store = KeyStore("mix", root=tmp_path / "keys")
    earlier = public_key()
    store.record_host_keys({"gpu-b02": [earlier]}, names)
    store.certificate_authority()  # the CA of the earlier life
    now = {name: [public_key()] for name in names}
    known.write_text(f"[2001:db8::b2]:2222 {now['gpu-b02'][0]}\n")
    down = {name: keys for name, keys in now.items() if name != "gpu-b02"}
    drift_first = plan_cluster(
        cluster,
        gathered_for(cluster, host_keys=down, sshd={n: fresh_sshd() for n in down}),
        store.snapshot(cluster.mesh_users, names),
    )
    first = plan_of(
        cluster, tmp_path / "keys", host_keys=down, sshd={n: fresh_sshd() for n in down}
    )
    assert refused_keys(tmp_path / "keys") == [earlier]
    back = plan_of(cluster, tmp_path / "keys", host_keys=now)
    krls = {
        p.nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys for p in (drift_first, first, back)
    }  # drift expected it
    assert len(krls) == 1
    (tmp_path / "krl").write_bytes(krls.pop())
    assert revoked(tmp_path / "krl", earlier, tmp_path)
    assert refused_keys(tmp_path / "keys") == [earlier]


def converged_gathered(cluster: Cluster, plan: ClusterPlan) -> Gathered:
    """What every node answers once it holds ``plan``: its certificates and trust blocks."""
    return dataclasses.replace(
        gathered_for(
            cluster,
            sshd={
                name: {
                    **fresh_sshd(),
                    "certificates": {
                        path: line.strip() for path, line in p.ssh_mesh.sshd.certificates.items()
                    },
                }
                for name, p in plan.nodes.items()
            },
            user_certificates={
                name: {u.user: u.certificate.strip() for u in p.ssh_mesh.users}
                for name, p in plan.nodes.items()
            },
        ),
        trust={
            name: {
                "/etc/ssh/ssh_known_hosts": p.ssh_mesh.known_hosts,
                **{u.user: u.authorized for u in p.ssh_mesh.users},
            }
            for name, p in plan.nodes.items()
        },
    )


def simulate_run(monkeypatch, cluster: Cluster, plan: ClusterPlan, fails: set[tuple[str, str]]):
    """deploy/cluster.py's mesh steps as pyinfra runs them: each step on every node before the
    next, its ``_if`` evaluated as it runs, a node that failed running nothing more; a failed
    step run with ``_ignore_errors`` fails no node and is noted (as ``HomeFaults`` notes it);
    ``mesh_users_failed`` fails every node it runs on.
    ``fails``: ``(node, step name)`` that fail. Returns ``{step name: nodes it ran on}`` and the
    nodes failed at the end."""
    from types import SimpleNamespace

    from tests.unit.test_plan import deploy_order

    steps = {
        node.name: [
            (op, kwargs)
            for op, kwargs in deploy_order(monkeypatch, cluster, node.name, plan)
            if op.startswith("ssh_mesh.")
        ]
        for node in cluster.nodes
    }
    names = [kwargs["name"] for _, kwargs in steps[cluster.nodes[0].name]]
    assert all([k["name"] for _, k in s] == names for s in steps.values())  # one order everywhere
    state = SimpleNamespace(failed_hosts=set())
    facts = run_facts(state)
    facts.whole_cluster, facts.failed_before_plan = True, set()
    ran: dict[str, list[str]] = {}
    with ctx_state.use(state):
        for at, name in enumerate(names):
            for node, node_steps in steps.items():
                op, kwargs = node_steps[at]
                with ctx_host.use(SimpleNamespace(name=node)):
                    gates = kwargs.get("_if") or []
                    gates = gates if isinstance(gates, list) else [gates]
                    if node in state.failed_hosts or not all(gate() for gate in gates):
                        continue
                ran.setdefault(name, []).append(node)
                if op == "ssh_mesh.mesh_users_failed" or (node, name) in fails:
                    if not kwargs.get("_ignore_errors"):
                        state.failed_hosts.add(node)
                    else:
                        assert note_home_failure(state, node, name, kwargs.get("_if")), name
    return ran, state.failed_hosts


WITH_BOB = MIXED.replace("[root, alice]", "[root, alice, bob]")
GRACE = "Logins under way finish before the old trust goes"


def test_a_mesh_that_does_not_move_does_not_wait(tmp_path, monkeypatch):
    """The wait before old trust goes is declared only in a run where the mesh moves: a
    converged mesh's deploy has no such step (a re-run changes nothing, and costs no time)."""
    from tests.unit.test_plan import deploy_order

    cluster = parse_cluster(WITH_BOB)
    old = plan_of(cluster, tmp_path / "keys")
    plan = planned(
        cluster, converged_gathered(cluster, old), KeyStore("mix", root=tmp_path / "keys")
    )
    assert not plan.nodes["gpu-a01"].ssh_mesh.moving
    ops = [op for op, _ in deploy_order(monkeypatch, cluster, "gpu-a01", plan)]
    assert "ssh_mesh.mesh_user" in ops and "ssh_mesh.logins_under_way_finish" not in ops


def test_after_rotate_ca_a_mesh_user_failing_on_one_node_keeps_the_old_ca_nowhere_else(
    tmp_path, monkeypatch
):
    """Issue #38, review finding 1: alice makes her own step on gpu-a02 fail every run (`chmod
    500 ~/.ssh`). Every node, gpu-a02 included, moves host, root and bob to the new CA, drops
    the old one and writes the KRL that refuses it; only alice's later steps on gpu-a02 wait,
    and gpu-a02 is still failed, in the mesh's last step. A root-owned failure still holds
    every drop back, as before."""
    cluster = parse_cluster(WITH_BOB)
    store = KeyStore("mix", root=tmp_path / "keys")
    old = plan_of(cluster, tmp_path / "keys")
    store.rotate_certificate_authority()
    plan = planned(cluster, converged_gathered(cluster, old), store)
    a01 = plan.nodes["gpu-a01"]
    assert a01.ssh_mesh.sshd.moving and all(u.moving for u in a01.ssh_mesh.users)
    assert a01.ssh_mesh.sshd.settled_revoked_keys not in (None, a01.ssh_mesh.sshd.revoked_keys)
    others = ["gpu-a01", "gpu-b01", "gpu-b02"]
    every = sorted([*others, "gpu-a02"])

    ran, failed = simulate_run(
        monkeypatch, cluster, plan, {("gpu-a02", "alice also trusts the mesh's new lines")}
    )

    # Every node moved host, root and bob and dropped the old CA; alice moved on the others.
    assert sorted(ran["sshd presents its host certificates, refuses revoked keys"]) == every
    assert sorted(ran["SSH mesh for alice"]) == others
    assert sorted(ran["SSH mesh for bob"]) == every
    for step in ("known_hosts trusts exactly", "root trusts exactly the mesh"):
        (name,) = [n for n in ran if n.startswith(step)]
        assert sorted(ran[name]) == every, name  # gpu-a02's root files too
    assert sorted(ran["alice trusts exactly the mesh"]) == others
    assert sorted(ran["bob trusts exactly the mesh"]) == every
    # Between presenting the new CA and dropping the old one, every node waits once: a login
    # under way finishes under the old trust (MESH_MOVE_GRACE_SECONDS).
    order = list(ran)
    assert sorted(ran[GRACE]) == every
    assert order.index("SSH mesh for root") < order.index(GRACE)
    assert order.index(GRACE) < min(order.index(n) for n in order if "exactly" in n)
    # gpu-a02's KRL takes the old CA too, and gpu-a02 alone is failed, after it.
    settled = "Revoked mesh keys and the old CA (/etc/ssh/trainfleet_revoked_keys)"
    assert sorted(ran[settled]) == every
    assert {plan.nodes[n].ssh_mesh.sshd.settled_revoked_keys for n in every} == {
        a01.ssh_mesh.sshd.settled_revoked_keys
    }
    assert "Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)" not in ran
    (last,) = [n for n in ran if n.startswith("The mesh steps in the homes of")]
    assert list(ran).index(last) > list(ran).index(settled) and ran[last] == ["gpu-a02"]
    assert failed == {"gpu-a02"}
    # The KRL refuses the old CA's certificates: gpu-a02's alice (never moved) is out.
    (tmp_path / "krl").write_bytes(a01.ssh_mesh.sshd.settled_revoked_keys)
    assert revoked(
        tmp_path / "krl", old.nodes["gpu-a02"].ssh_mesh.users[1].certificate.strip(), tmp_path
    )
    assert not revoked(tmp_path / "krl", a01.ssh_mesh.users[1].certificate.strip(), tmp_path)

    # A root-owned failure (gpu-a02's sshd) holds every move and drop back, as before.
    held, failed = simulate_run(
        monkeypatch,
        cluster,
        plan,
        {("gpu-a02", "sshd presents its host certificates, refuses revoked keys")},
    )
    assert not [name for name in held if "exactly" in name or name.startswith("SSH mesh for")]
    assert GRACE not in held  # nothing old is dropped: nothing to wait for
    assert sorted(held["Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)"]) == others
    assert failed == {"gpu-a02"}


def test_a_mesh_user_failing_on_one_node_holds_back_no_revocation_on_it(tmp_path, monkeypatch):
    """Review finding 1: root's key on gpu-b01 is stolen and revoked; alice's own step on gpu-a02
    fails every run. gpu-a02's KRL still takes the revocation in the same run (so root's trust
    of the CA there no longer admits the thief's certificate), bob's steps there still run, and
    gpu-a02 is failed in the mesh's last step, naming alice and her step."""
    cluster = parse_cluster(WITH_BOB)
    store = KeyStore("mix", root=tmp_path / "keys")
    old = plan_of(cluster, tmp_path / "keys")
    stolen = store.keypair("root", "gpu-b01").public.strip()
    stolen_certificate = old.nodes["gpu-b01"].ssh_mesh.users[0].certificate.strip()
    store.revoke("root", "gpu-b01")
    gathered = converged_gathered(cluster, old)
    for name, p in old.nodes.items():
        gathered.sshd[name]["revoked_keys"] = (
            p.ssh_mesh.sshd.revoked_keys
        )  # the KRL each node holds
    plan = planned(cluster, gathered, store)
    a02 = plan.nodes["gpu-a02"]
    assert a02.ssh_mesh.sshd.revoked_keys != old.nodes["gpu-a02"].ssh_mesh.sshd.revoked_keys

    ran, failed = simulate_run(
        monkeypatch, cluster, plan, {("gpu-a02", "alice also trusts the mesh's new lines")}
    )

    step = "Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)"
    assert "gpu-a02" in ran[step] and "gpu-a02" in ran["bob trusts exactly the mesh"]
    assert "gpu-a02" not in ran["alice trusts exactly the mesh"]
    assert failed == {"gpu-a02"}
    (tmp_path / "krl").write_bytes(a02.ssh_mesh.sshd.revoked_keys)
    assert revoked(tmp_path / "krl", stolen, tmp_path)
    assert revoked(tmp_path / "krl", stolen_certificate, tmp_path)
    # The operation writes it on gpu-a02 (it holds the old KRL), and fails the node with alice.
    writes, _ = run_op(
        revoked_keys,
        [(SshdMesh, {}, gathered.sshd["gpu-a02"])],
        content=a02.ssh_mesh.sshd.revoked_keys,
    )
    assert [written(c)[0] for c in writes] == [REVOKED_KEYS]
    state = FakeState()
    node = create_host(state, name="gpu-a02", facts={})
    note_home_failure(
        state, node.name, "alice also trusts the mesh's new lines", HomeIntact("alice")
    )
    with ctx_state.use(state), ctx_host.use(node):
        (failing,) = list(mesh_users_failed._inner())
    assert isinstance(failing, FailCommand)
    said = shlex.split(failing.get_raw_value())[1]
    assert said.startswith('trainfleet: alice: the step "alice also trusts the mesh\'s new lines"')


def test_the_old_ca_joins_the_krl_once_every_node_presents_the_new_one_and_a_rerun_changes_nothing(
    tmp_path,
):
    """The move's run writes the settled KRL (the old CA revoked); the next run's prepare_keys
    settles the store (its root's and hosts' certificates are the new CA's), which then plans the
    same bytes; drift, between the two, expects them too. gpu-a02's alice, still on the old CA,
    does not hold it back."""
    cluster = parse_cluster(MIXED)
    store = KeyStore("mix", root=tmp_path / "keys")
    old = plan_of(cluster, tmp_path / "keys")
    old_ca = store.certificate_authority().public
    store.rotate_certificate_authority()
    move = planned(cluster, converged_gathered(cluster, old), store)
    settled = move.nodes["gpu-a01"].ssh_mesh.sshd.settled_revoked_keys
    after = converged_gathered(cluster, move)
    after.user_certificates["gpu-a02"]["alice"] = (
        old.nodes["gpu-a02"].ssh_mesh.users[1].certificate.strip()
    )
    drift = plan_cluster(cluster, after, store.snapshot(cluster.mesh_users, names_of(cluster)))
    assert store.ca_moving() and drift.nodes["gpu-b01"].ssh_mesh.sshd.revoked_keys == settled
    rerun = planned(cluster, after, store)
    assert not store.ca_moving()
    assert " ".join(old_ca.split()[:2]) in refused_keys(tmp_path / "keys")
    assert {p.ssh_mesh.sshd.revoked_keys for p in rerun.nodes.values()} == {settled}
    assert (
        rerun.nodes["gpu-a01"].ssh_mesh.sshd.settled_revoked_keys is None
    )  # nothing moves any more
    assert planned(cluster, after, store).nodes["gpu-a01"].ssh_mesh.sshd.revoked_keys == settled


def test_a_store_whose_ca_move_settled_before_old_cas_were_revoked_revokes_them_once(tmp_path):
    cluster = parse_cluster(MIXED)
    store = KeyStore("mix", root=tmp_path / "keys")
    plan_of(cluster, tmp_path / "keys")
    old_ca = store.certificate_authority().public
    store.rotate_certificate_authority()
    (store.dir / ".ca" / "moving").unlink()  # what an older trainfleet's settled move left
    assert store.revoke_retired_cas() == [old_ca]
    assert store.revoke_retired_cas() == []
    assert refused_keys(tmp_path / "keys") == [" ".join(old_ca.split()[:2])]


def names_of(cluster: Cluster) -> list[str]:
    return [n.name for n in cluster.nodes]


def test_the_settled_krl_replaces_the_one_sshd_certificates_wrote_this_run_on_a_new_node(tmp_path):
    """A node that had no KRL got the plan's from sshd_certificates this run (a move from a key
    mesh): the settled KRL (the old CA revoked) is written over it, the plain one is not again."""
    from operations.ssh_mesh_ops import revoked_keys

    cluster = parse_cluster(MIXED)
    store = KeyStore("mix", root=tmp_path / "keys")
    old = plan_of(cluster, tmp_path / "keys")
    store.rotate_certificate_authority()
    sshd = planned(cluster, converged_gathered(cluster, old), store).nodes["gpu-a01"].ssh_mesh.sshd
    facts = [(SshdMesh, {}, fresh_sshd())]  # no KRL when the run began
    plain, _ = run_op(revoked_keys, facts, content=sshd.revoked_keys)
    assert plain == []
    settled, _ = run_op(
        revoked_keys, facts, content=sshd.settled_revoked_keys, written=sshd.revoked_keys
    )
    ((path, _, data),) = [written(command) for command in settled]
    assert (path, data) == (REVOKED_KEYS, sshd.settled_revoked_keys)
    same, _ = run_op(
        revoked_keys,
        [(SshdMesh, {}, {**fresh_sshd(), "revoked_keys": sshd.settled_revoked_keys})],
        content=sshd.settled_revoked_keys,
        written=sshd.revoked_keys,
    )
    assert same == []
