"""The controller's key store: concurrent writers, the lock, retirement, and modes."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from trainfleet import keystore
from trainfleet.keystore import KeyStore, KeyStoreBusy, KeyStoreError

NODES = ["a", "b", "c"]


def _derived_public(private: str) -> str:
    key = serialization.load_ssh_private_key(private.encode(), password=None)
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def _files_match(store: KeyStore, user: str, node: str) -> bool:
    """The pair on disk: the .pub file's key is the private key's own public half."""
    private = (store.dir / user / node).read_text()
    public = (store.dir / user / f"{node}.pub").read_text()
    return public.split()[:2] == _derived_public(private).split()


def _generate_after(root: str, barrier, results) -> None:
    barrier.wait()  # every process asks for the same missing keys at once
    store = KeyStore("c1", root=Path(root))
    results.put({node: store.keypair("root", node).public for node in NODES})


def test_processes_generating_the_same_keys_at_once_agree_and_leave_matching_pairs(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs_n = 6
    barrier, results = ctx.Barrier(procs_n), ctx.Queue()
    procs = [
        ctx.Process(target=_generate_after, args=(str(tmp_path / "keys"), barrier, results))
        for _ in range(procs_n)
    ]
    for proc in procs:
        proc.start()
    seen = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert all(s == seen[0] for s in seen)  # one key per node, whoever made it
    store = KeyStore("c1", root=tmp_path / "keys")
    for node in NODES:
        assert _files_match(store, "root", node)
        assert store.keypair("root", node).public == seen[0][node]
    assert not [p for p in (store.dir / "root").iterdir() if p.name.endswith(".tmp")]


def test_a_held_lock_makes_a_writer_wait_then_fail_naming_the_other_process(tmp_path, monkeypatch):
    monkeypatch.setattr(keystore, "LOCK_WAIT_S", 0.3)
    store = KeyStore("c1", root=tmp_path / "keys")
    store.keypair("root", "a")  # existing keys are read without the lock
    other = os.open(store.dir / keystore.LOCK_NAME, os.O_RDWR)  # another open file: another holder
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        assert store.keypair("root", "a").public  # reading an existing key needs no lock
        with pytest.raises(KeyStoreBusy, match="another trainfleet process"):
            store.keypair("root", "b")
        with pytest.raises(KeyStoreBusy):
            store.rotate("root", "a")
        assert not (store.dir / "root" / "b").exists()
    finally:
        os.close(other)
    assert store.keypair("root", "b").public


def test_a_stale_public_file_never_pairs_with_the_private_key(tmp_path):
    """A .pub from an interrupted or old writer: the public half comes from the private key,
    and the file is rewritten."""
    store = KeyStore("c1", root=tmp_path / "keys")
    first = store.keypair("root", "a")
    other = KeyStore("c1", root=tmp_path / "keys").keypair("root", "b")
    (store.dir / "root" / "a.pub").write_text(other.public + "\n")
    again = KeyStore("c1", root=tmp_path / "keys").keypair("root", "a")
    assert again.public == first.public
    assert (store.dir / "root" / "a.pub").read_text() == first.public + "\n"


def test_a_node_removed_from_the_spec_has_its_keys_retired_and_comes_back_with_a_new_key(tmp_path):
    root = tmp_path / "keys"
    store = KeyStore("c1", root=root)
    old = {(u, n): store.keypair(u, n) for u in ("root", "alice") for n in NODES}
    store.revoke("alice", "a")

    KeyStore("c1", root=root).retire_absent(["b", "c"])  # a left the spec

    for user in ("root", "alice"):
        assert not any((store.dir / user / f"a{s}").exists() for s in ("", ".pub", ".revoked"))
        assert (
            KeyStore("c1", root=root).keypair(user, "b") == old[(user, "b")]
        )  # the others keep theirs
    retired = store.retired()
    assert sorted(p.relative_to(store.dir / "retired").parts[1:] for p in retired) == [
        ("alice", "a.revoked"),
        ("root", "a"),
        ("root", "a.pub"),
    ]
    assert (retired[1].read_text(), retired[2].read_text()) == (
        old[("root", "a")].private,
        old[("root", "a")].public + "\n",
    )
    assert stat.S_IMODE(retired[1].stat().st_mode) == 0o600
    assert stat.S_IMODE(retired[1].parent.parent.stat().st_mode) == 0o700

    # Calling it again (every host's run does) moves nothing and makes no new folder.
    assert KeyStore("c1", root=root).retire_absent(["b", "c"]) == []
    assert len(list((store.dir / "retired").iterdir())) == 1

    back = KeyStore("c1", root=root).keypair("root", "a")
    assert back.public != old[("root", "a")].public and back.private != old[("root", "a")].private
    assert not KeyStore("c1", root=root).is_revoked("alice", "a")


def test_the_store_never_changes_the_mode_of_trainfleet_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    os.chmod(tmp_path, 0o755)
    monkeypatch.setenv("TRAINFLEET_HOME", str(home))
    store = KeyStore("c1")
    store.keypair("root", "a")
    store.rotate("root", "a")
    store.revoke("root", "b")
    KeyStore("c1").retire_absent(["a"])  # retires c's and b's files
    assert stat.S_IMODE(home.stat().st_mode) == 0o755
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    for directory in (home / "keys", store.dir, store.dir / "root"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    for name in ("a", "a.pub", ".lock"):
        assert (
            stat.S_IMODE(
                (store.dir / "root" / name if name != ".lock" else store.dir / name).stat().st_mode
            )
            == 0o600
        )


def test_keys_are_0600_in_0700_dirs_and_the_private_half_is_never_shown(tmp_path):
    store = KeyStore("c1", root=tmp_path / "keys")
    pair = store.keypair("root", "a")
    for name in ("a", "a.pub"):
        assert stat.S_IMODE((store.dir / "root" / name).stat().st_mode) == 0o600
    for directory in (tmp_path / "keys", store.dir, store.dir / "root"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    body = pair.private.splitlines()[1]  # a line of the key itself, not the PEM armour
    for shown in (repr(pair), str(pair), f"{pair}", repr([pair])):
        assert body not in shown and pair.public in shown


def test_a_user_named_like_the_retired_folder_is_refused(tmp_path):
    with pytest.raises(keystore.KeyStoreError, match="retired"):
        KeyStore("c1", root=tmp_path / "keys").keypair("retired", "a")


def test_names_that_would_leave_the_store_are_refused(tmp_path):
    for cluster, user, node in (
        ("..", "root", "n1"),
        ("c", "../../x", "n1"),
        ("c", "root", "a/b"),
        ("c", "root", ".."),
    ):
        with pytest.raises(KeyStoreError):
            KeyStore(cluster, root=tmp_path).keypair(user, node)
    assert list(tmp_path.iterdir()) == []


def test_the_cluster_ca_is_made_once_kept_0600_and_never_retired(tmp_path):
    import stat

    from trainfleet.keystore import KeyStore

    store = KeyStore("prod", root=tmp_path / "keys")
    ca = store.certificate_authority()
    assert ca.public.startswith("ssh-ed25519 ") and ca.public.endswith(" trainfleet:prod:ca")
    assert "PRIVATE" not in repr(ca) and "PRIVATE" not in str(ca)
    path = tmp_path / "keys" / "prod" / ".ca" / "ca"
    assert (
        stat.S_IMODE(path.stat().st_mode) == 0o600
        and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    )
    assert (path.parent / "ca.pub").read_text() == ca.public + "\n"
    store.keypair("root", "gpu-a01")
    KeyStore("prod", root=tmp_path / "keys").retire_absent([])
    assert KeyStore("prod", root=tmp_path / "keys").retired() != []  # the node's key is retired ...
    assert (
        KeyStore("prod", root=tmp_path / "keys").certificate_authority() == ca
    )  # ... the CA is not


def test_revoking_rotating_and_retiring_add_exactly_the_old_public_key_once(tmp_path):
    root = tmp_path / "keys"
    store = KeyStore("c1", root=root)
    old = {node: store.keypair("root", node).public for node in NODES}
    assert store.revoked_keys() == []

    store.revoke("root", "a")
    store.revoke("root", "a")  # again: the key is gone already, nothing more to add
    assert store.revoked_keys() == [old["a"]]

    store.rotate("root", "b")
    assert store.revoked_keys() == [old["a"], old["b"]]
    rotated = store.keypair("root", "b").public
    assert (
        rotated != old["b"] and rotated not in store.revoked_keys()
    )  # the new key is in use, not revoked

    store.rotate("root", "a")  # back in with a new key: a revoked node has no old key left to add
    assert store.revoked_keys() == [old["a"], old["b"]]

    KeyStore("c1", root=root).retire_absent(["a", "b"])  # c left the spec
    KeyStore("c1", root=root).retire_absent(["a", "b"])  # a second run does it again
    assert store.revoked_keys() == [old["a"], old["b"], old["c"]]
    assert (store.dir / ".ca" / "revoked").read_text() == "".join(
        f"{line}\n" for line in store.revoked_keys()
    )
    assert stat.S_IMODE((store.dir / ".ca" / "revoked").stat().st_mode) == 0o600
    assert stat.S_IMODE((store.dir / ".ca").stat().st_mode) == 0o700


def test_a_revoked_node_that_comes_back_and_is_rotated_again_adds_only_its_new_key(tmp_path):
    store = KeyStore("c1", root=tmp_path / "keys")
    first = store.keypair("alice", "a").public
    store.revoke("alice", "a")
    store.rotate("alice", "a")
    second = store.keypair("alice", "a").public
    store.rotate("alice", "a")
    assert store.revoked_keys() == [first, second]
    assert KeyStore("c1", root=tmp_path / "keys").revoked_keys() == [
        first,
        second,
    ]  # what another process reads


def test_revoking_a_node_revokes_the_key_it_holds_even_when_its_public_file_is_stale(tmp_path):
    store = KeyStore("c1", root=tmp_path / "keys")
    held = store.keypair("root", "a")
    other = store.keypair("root", "b")
    (store.dir / "root" / "a.pub").write_text(
        other.public + "\n"
    )  # as in the stale-.pub test above
    store.revoke("root", "a")
    assert [line.split()[:2] for line in store.revoked_keys()] == [held.public.split()[:2]]


HOST_A = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAaaa"
HOST_C = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAccc"


def test_a_revoked_host_key_stays_revoked_when_its_node_presents_it_again_until_readmitted(
    tmp_path,
):
    store = KeyStore("c1", root=tmp_path / "keys")
    a_key, c_key = HOST_A, HOST_C
    store.record_host_keys({"a": [a_key], "c": [c_key]}, ["a", "c"])
    assert store.record_host_keys({"a": [a_key]}, ["a"]) == [c_key]  # c left the spec: revoked
    revoked = [" ".join(line.split()[:2]) for line in store.revoked_keys()]
    assert revoked == [c_key]

    # c is back in the spec, presenting the key it had: it stays revoked, not vouched for.
    assert store.record_host_keys({"a": [a_key], "c": [c_key]}, ["a", "c"]) == []
    assert [" ".join(line.split()[:2]) for line in store.revoked_keys()] == revoked
    assert store.host_keys().get("c", []) == []

    # Only the operator's explicit word takes it back: then the next run vouches for it again.
    assert store.readmit_host_keys("a") == []  # nothing of a's was revoked
    assert [" ".join(line.split()[:2]) for line in store.readmit_host_keys("c")] == [c_key]
    assert store.revoked_keys() == []
    store.record_host_keys({"a": [a_key], "c": [c_key]}, ["a", "c"])
    assert store.host_keys()["c"] == [c_key] and store.revoked_keys() == []


def test_keys_readmit_is_explicit_and_takes_back_only_the_named_nodes_host_keys(
    tmp_path, monkeypatch, capsys
):
    from trainfleet.__main__ import main

    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path / "home"))
    spec = tmp_path / "c1.yml"
    spec.write_text(
        "cluster: {name: c1, mesh_users: [root]}\nnodes:\n"
        "  - {name: a, address: 198.18.0.11}\n  - {name: c, address: 198.18.0.13}\n"
    )
    store = KeyStore("c1")
    a_key, c_key = HOST_A, HOST_C
    store.record_host_keys({"a": [a_key], "c": [c_key]}, ["a", "c"])
    store.record_host_keys({}, [])  # both left the spec
    assert main(["keys", "readmit", str(spec)]) != 0  # names no node: refused, nothing taken back
    assert main(["keys", "readmit", str(spec), "c"]) == 0
    assert "c: 1 revoked host key(s) taken back" in capsys.readouterr().out
    assert [" ".join(line.split()[:2]) for line in store.revoked_keys()] == [a_key]
