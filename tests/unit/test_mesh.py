"""The SSH mesh as data, and the controller's key store."""

from __future__ import annotations

import stat

from tests.unit.test_plan import prepared
from trainfleet.key_material import KeyMaterial
from trainfleet.keystore import KeyStore
from trainfleet.mesh import authorized_lines, identity, known_hosts_lines
from trainfleet.spec import parse_cluster

SPEC = """\
cluster: {name: c1, domain: example.com}
nodes:
  - {name: a, address: 192.0.2.1}
  - {name: b, address: 192.0.2.2, ssh: {port: 2222}}
"""


def snapshot(store: KeyStore) -> KeyMaterial:
    return store.snapshot(["root"], ["a", "b"])


def test_known_hosts_name_every_node_by_name_fqdn_and_address():
    cluster = parse_cluster(SPEC)
    lines = known_hosts_lines(
        cluster, {"a": ["ssh-ed25519 AAAA1"], "b": ["ssh-ed25519 BBBB", "ecdsa-sha2-nistp256 CCCC"]}
    )
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
    assert (
        first.private.splitlines()[0] == "-----BEGIN " + "OPENSSH PRIVATE KEY-----"
    )  # OpenSSH format
    assert first.public.startswith("ssh-ed25519 ") and first.public.endswith(
        " trainfleet:c1:root@a"
    )
    assert stat.S_IMODE((store.dir / "root" / "a").stat().st_mode) == 0o600
    assert stat.S_IMODE((store.dir / "root").stat().st_mode) == 0o700
    assert first.private not in repr(first)


def test_a_revoked_node_leaves_every_authorized_keys_until_rotated(tmp_path):
    cluster = parse_cluster(SPEC)
    store = KeyStore("c1", root=tmp_path / "keys")
    assert authorized_lines(cluster, "root", snapshot(store)) == []  # nothing made on the way
    before = authorized_lines(cluster, "root", prepared(store, cluster))
    assert len(before) == 2

    store.revoke("root", "b")
    assert authorized_lines(cluster, "root", snapshot(store)) == before[:1]
    assert identity("root", cluster.node("b"), snapshot(store)) is None

    store.rotate("root", "b")
    after = authorized_lines(cluster, "root", snapshot(store))
    assert after[0] == before[0] and after[1] != before[1]


def test_the_managed_ssh_config_wins_for_cluster_hosts_and_leaves_the_users_defaults(tmp_path):
    """What `ssh -G` (the real client) resolves with the block first and the user's own
    `Host *` defaults after it, as trainfleet writes ~/.ssh/config."""
    import subprocess

    from trainfleet.blocks import markers
    from trainfleet.render import render_lines

    cluster = parse_cluster(SPEC)
    begin, end = markers("ssh mesh hosts")
    block = render_lines(
        "ssh_mesh/ssh_config.j2", nodes=cluster.nodes, user="root", key_name="id_trainfleet"
    )
    config = tmp_path / "config"
    config.write_text(
        "\n".join(
            [
                begin,
                *block,
                end,
                "ServerAliveInterval 42",
                "Host *",
                "    User alice",
                "    Port 2200",
            ]
        )
        + "\n"
    )

    def resolved(host: str) -> dict[str, str]:
        out = subprocess.run(
            ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True
        ).stdout
        return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)

    b = resolved("b")
    assert (b["user"], b["hostname"], b["port"]) == ("root", "192.0.2.2", "2222")
    assert b["serveraliveinterval"] == "42"  # the user's own default still applies
    other = resolved("fileserver")
    assert (other["user"], other["port"]) == ("alice", "2200")


# A stand-in ssh for the mesh probe: per peer, a script of answers, one per attempt. The
# messages are OpenSSH 9.2's: sshd over its MaxStartups drops the connection before the
# key exchange; a key missing from authorized_keys is refused.
_FAKE_SSH = r"""#!/bin/sh
for last; do :; done  # the command ("true")
peer=$(for a; do
  case $a in -*|true|BatchMode=*|StrictHostKeyChecking=*|ConnectTimeout=*) ;; *) echo "$a";; esac
done | tail -n 1)
n=$(cat "$FAKE_DIR/$peer.n" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "$FAKE_DIR/$peer.n"
answer=$(sed -n "${n}p" "$FAKE_DIR/$peer.answers")
case $answer in
  ok) exit 0 ;;
  dropped) echo "kex_exchange_identification: Connection closed by remote host" >&2; exit 255 ;;
  refused) echo "root@$peer: Permission denied (publickey)." >&2; exit 255 ;;
esac
"""


def run_probe(tmp_path, answers: dict[str, list[str]]) -> tuple[dict[str, str], dict[str, int]]:
    import os
    import subprocess

    from facts.ssh_mesh_facts import SshMeshProof

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(_FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    for peer, script in answers.items():
        (tmp_path / f"{peer}.answers").write_text("\n".join(script) + "\n")
    fact = SshMeshProof()
    command = fact.command(user="root", peers=list(answers)).get_raw_value()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path)}
    out = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env=env, timeout=30
    ).stdout
    attempts = {peer: int((tmp_path / f"{peer}.n").read_text()) for peer in answers}
    return fact.process(out.splitlines()), attempts


def test_the_mesh_probe_tries_a_dropped_connection_once_more_and_a_refusal_never(tmp_path):
    result, attempts = run_probe(
        tmp_path,
        {"a": ["dropped", "ok"], "b": ["refused", "ok"], "c": ["ok"], "d": ["dropped", "dropped"]},
    )
    assert result["a"] == "ok" and attempts["a"] == 2  # sshd was busy: fine the second time
    assert (
        result["b"].startswith("rc=255")
        and "Permission denied" in result["b"]
        and attempts["b"] == 1
    )
    assert result["c"] == "ok" and attempts["c"] == 1
    assert (
        "kex_exchange_identification" in result["d"] and attempts["d"] == 2
    )  # reported after one retry


def test_the_ca_lines_name_each_port_apart_and_trust_the_ca_only_for_the_mesh_user():
    """a (port 22) and b (port 2222) share 192.0.2.?: each port's line lists its names as they
    are."""
    from trainfleet.mesh import ca_authorized_line, ca_known_hosts_lines

    cluster = parse_cluster(SPEC)
    ca = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICA trainfleet:c1:ca"
    assert ca_known_hosts_lines(cluster, ca) == [
        "@cert-authority a,a.example.com,192.0.2.1 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICA "
        "trainfleet:c1:ca",
        "@cert-authority [b]:2222,[b.example.com]:2222,[192.0.2.2]:2222 ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAICA trainfleet:c1:ca",
    ]
    assert (
        ca_authorized_line(cluster, "alice", ca + " extra words")
        == 'cert-authority,principals="alice" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICA '
        "trainfleet:c1:ca"
    )
