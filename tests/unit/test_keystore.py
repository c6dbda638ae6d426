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
    assert store.readmit_host_keys("a", [a_key, c_key]) == []  # nothing of a's was revoked
    assert store.readmit_host_keys("c", [HOST_A]) == []  # not a key revoked under c's name
    assert [" ".join(line.split()[:2]) for line in store.readmit_host_keys("c", [c_key])] == [c_key]
    assert store.revoked_keys() == []
    store.record_host_keys({"a": [a_key], "c": [c_key]}, ["a", "c"])
    assert store.host_keys()["c"] == [c_key] and store.revoked_keys() == []


SPEC_C1 = (
    "cluster: {name: c1, mesh_users: [root]}\nssh: {known_hosts: KNOWN}\nnodes:\n"
    "  - {name: a, address: 198.18.0.11}\n  - {name: c, address: 198.18.0.13}\n"
)


def readmit_setup(tmp_path, monkeypatch) -> tuple[Path, Path, KeyStore, list[str], str]:
    """A cluster whose nodes a and c both left the spec (their host keys revoked: a's two, c's
    one, returned); the controller's known_hosts file (empty) named by the spec."""
    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path / "home"))
    known = tmp_path / "known_hosts"
    known.write_text("")
    spec = tmp_path / "c1.yml"
    spec.write_text(SPEC_C1.replace("KNOWN", str(known)))
    store = KeyStore("c1")
    a_keys = sorted([public_key_line(), public_key_line()])
    c_key = public_key_line()
    store.record_host_keys({"a": a_keys, "c": [c_key]}, ["a", "c"])
    store.record_host_keys({}, [])  # both left the spec
    return spec, known, store, a_keys, c_key


def public_key_line() -> str:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )


def revoked_types_and_keys(store: KeyStore) -> list[str]:
    return sorted(" ".join(line.split()[:2]) for line in store.revoked_keys())


def test_keys_readmit_takes_back_only_the_fingerprints_the_operator_names(
    tmp_path, monkeypatch, capsys
):
    from trainfleet.__main__ import main
    from trainfleet.certificates import fingerprint

    spec, _, store, a_keys, c_key = readmit_setup(tmp_path, monkeypatch)
    everything = revoked_types_and_keys(store)
    assert main(["keys", "readmit", str(spec), "a", "--fingerprint", fingerprint(a_keys[0])]) == 0
    out = capsys.readouterr().out
    assert f"a: 1 revoked host key(s) taken back ({fingerprint(a_keys[0])})" in out
    assert "1 other(s) revoked under its name stay revoked" in out
    assert revoked_types_and_keys(store) == sorted(set(everything) - {a_keys[0]})


@pytest.mark.parametrize(
    "extra, why, status",
    [
        # a command line that names neither or both: a usage error (64)
        ([], "give one of the two", 64),  # neither: nothing is taken back on a name alone
        (["--known-hosts", "--fingerprint", "FP_A"], "give one of the two", 64),  # both
        (["--fingerprint", "SHA256:short"], "is not a fingerprint", 2),
        (["--fingerprint", "FP_C"], "is not a host key revoked under these names", 2),  # c's
        (["--fingerprint", "FP_A", "--fingerprint", "FP_C"], "FP_C is not a host key revoked", 2),
        (["--known-hosts"], "lists no host key for a", 2),  # the controller lists nothing for a
    ],
)
def test_keys_readmit_refuses_doubtful_input_with_exit_2_and_takes_nothing_back(
    tmp_path, monkeypatch, capsys, extra, why, status
):
    from trainfleet.__main__ import main
    from trainfleet.certificates import fingerprint

    spec, _, store, a_keys, c_key = readmit_setup(tmp_path, monkeypatch)
    everything = store.revoked_keys()
    prints = {"FP_A": fingerprint(a_keys[0]), "FP_C": fingerprint(c_key)}
    argv = [prints.get(arg, arg) for arg in ["keys", "readmit", str(spec), "a", *extra]]
    assert main(argv) == status
    err = capsys.readouterr().err
    assert why.replace("FP_C", prints["FP_C"]) in err
    assert store.revoked_keys() == everything


def test_keys_readmit_known_hosts_takes_back_the_keys_the_controller_lists_for_the_node_only(
    tmp_path, monkeypatch, capsys
):
    from trainfleet.__main__ import main

    spec, known, store, a_keys, c_key = readmit_setup(tmp_path, monkeypatch)
    # The controller's known_hosts lists one of a's revoked keys; c has its own revoked key
    # listed under a's address: it is not taken back under a's name.
    known.write_text(f"198.18.0.11 {a_keys[1]}\n198.18.0.11 {c_key}\n")
    assert main(["keys", "readmit", str(spec), "a", "--known-hosts"]) == 0
    assert "a: 1 revoked host key(s) taken back" in capsys.readouterr().out
    assert " ".join(a_keys[1].split()[:2]) not in revoked_types_and_keys(store)
    assert a_keys[0] in revoked_types_and_keys(store)
    assert c_key in revoked_types_and_keys(store)


@pytest.mark.parametrize(
    "listing, why",
    [
        # Review finding 6: a new key appended beside the revoked one (no ssh-keygen -R).
        ("198.18.0.11 A1\n198.18.0.11 NEW\n", "beside another ssh-ed25519 key"),
        # Review finding 10: a line paramiko cannot parse is named, never a traceback.
        ("198.18.0.11 A1\n198.18.0.11 ssh-ed25519 AAAA!!notbase64\n", "known_hosts:2: not a"),
        ("198.18.0.11 A1\n# caf\xe9\n", "known_hosts:2: not UTF-8 text"),
    ],
)
def test_keys_readmit_known_hosts_refuses_an_ambiguous_or_malformed_listing(
    tmp_path, monkeypatch, capsys, listing, why
):
    from trainfleet.__main__ import main

    spec, known, store, a_keys, _ = readmit_setup(tmp_path, monkeypatch)
    everything = store.revoked_keys()
    text = listing.replace("A1", a_keys[1]).replace("NEW", public_key_line())
    known.write_bytes(text.encode("latin-1"))
    assert main(["keys", "readmit", str(spec), "a", "--known-hosts"]) == 2
    err = capsys.readouterr().err
    assert why in err and "nothing was taken back" in err and "Traceback" not in err
    assert store.revoked_keys() == everything


def test_a_malformed_controller_known_hosts_is_named_by_the_plan_and_the_inventory(tmp_path):
    """Review finding 10: the deploy's and drift's plan (a node not read falls back on the
    controller's known_hosts) and the inventory that every run loads name the file and line."""
    from runtime.inventory import load_cluster_or_exit
    from trainfleet import mesh

    known = tmp_path / "known_hosts"
    known.write_text(f"198.18.0.11 {public_key_line()}\n198.18.0.13 ssh-ed25519 AAAA!!notbase64\n")
    with pytest.raises(mesh.KnownHostsError, match=r"known_hosts:2: not a host key line"):
        mesh.controller_known_keys("198.18.0.11", 22, str(known))
    spec = tmp_path / "c1.yml"
    spec.write_text(SPEC_C1.replace("KNOWN", str(known)))
    with pytest.raises(SystemExit) as exit_:
        load_cluster_or_exit(spec)
    assert exit_.value.code == 2


def test_keys_readmit_names_no_node_or_acts_for_another_command_is_refused(tmp_path, monkeypatch):
    from trainfleet.__main__ import main

    spec, _, store, _, _ = readmit_setup(tmp_path, monkeypatch)
    everything = store.revoked_keys()
    assert main(["keys", "readmit", str(spec), "--known-hosts"]) == 64  # names no node
    assert main(["keys", "list", str(spec), "--known-hosts"]) == 64
    assert store.revoked_keys() == everything


def test_a_node_reinstalled_while_down_has_its_old_host_keys_revoked_at_once(tmp_path):
    """The controller's known_hosts lists other keys for a node not read this run (new servers;
    the store knew the earlier ones): they are gone now, not when the node is back, and its
    record is left for the run that reads it. A listing that still holds one vouched key, or
    none at all, is no reimage: nothing is revoked."""
    store = KeyStore("c1", root=tmp_path / "keys")
    earlier = sorted([public_key_line(), public_key_line()])
    store.record_host_keys({"a": [HOST_A], "c": earlier}, ["a", "c"])
    assert store.record_host_keys({"a": [HOST_A]}, ["a", "c"], {"c": [earlier[1]]}) == []
    assert store.record_host_keys({"a": [HOST_A]}, ["a", "c"], {"c": []}) == []
    assert store.record_host_keys({"a": [HOST_A]}, ["a", "c"]) == []
    assert store.revoked_keys() == []
    new = public_key_line()
    assert store.record_host_keys({"a": [HOST_A]}, ["a", "c"], {"c": [new]}) == earlier
    assert store.host_keys()["c"] == earlier  # vouched for until the node is read
    revoked = store.revoked_keys()
    # Later runs, still down, then back with the listed key: nothing more is revoked.
    assert store.record_host_keys({"a": [HOST_A]}, ["a", "c"], {"c": [new]}) == []
    assert store.record_host_keys({"a": [HOST_A], "c": [new]}, ["a", "c"]) == []
    assert store.revoked_keys() == revoked and store.host_keys()["c"] == [new]
