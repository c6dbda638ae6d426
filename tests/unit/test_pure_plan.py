"""A pure plan (issue #27): only the deploy's ``prepare_keys`` writes the key store; drift, the
preflight and the plan builder read it and leave it byte-identical, on an empty store (whose
folder they must not even create) and on a converged one."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.controller import fleet as fleet_mod
from bench.controller.record import load
from checks import drift_check, hygiene_stage, mesh_stage
from checks.preflight_report import PreflightReport
from runtime.bundle import plan_inputs
from tests.unit.test_plan import public_key
from trainfleet.key_preparation import prepare_keys
from trainfleet.keystore import KeyStore
from trainfleet.plan import cluster_blocks, plan_cluster

# -- a guard: any write to the file system while it is armed fails the test ----------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_WRITING_EVENTS = {
    "os.rename",  # os.rename and os.replace
    "os.remove",  # os.remove and os.unlink
    "os.mkdir",
    "os.rmdir",
    "os.chmod",
    "os.chown",
    "os.symlink",
    "os.link",
    "os.truncate",
    "os.utime",
    "fcntl.flock",
    "tempfile.mkstemp",
    "tempfile.mkdtemp",
    "shutil.copyfile",
    "shutil.rmtree",
    "subprocess.Popen",
    "os.system",
    "os.posix_spawn",
}
_seen: list[list[str]] = []  # while a guard is armed: the list its block's writes go to
_installed = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if not _seen:
        return
    if event == "open":
        _, mode, flags = (*args, None, None)[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & _WRITE_FLAGS
        )
        if not writing:
            return
    elif event not in _WRITING_EVENTS:
        return
    _seen[0].append(f"{event} {args[:2]!r}")
    raise PermissionError(f"a write while the plan was built: {event} {args[:2]!r}")


class NoWrites:
    """``with NoWrites() as seen:`` fails every write in the block (an audit hook, installed once
    per process: hooks cannot be removed, so it acts only while armed) and lists in ``seen``
    what was tried, even where the code under test swallowed the error."""

    def __enter__(self) -> list[str]:
        global _installed
        if not _installed:
            sys.addaudithook(_hook)
            _installed = True
        _seen[:] = [[]]
        return _seen[0]

    def __exit__(self, *exc: Any) -> None:
        _seen.clear()


def test_the_guard_catches_writes(tmp_path):
    """The guard is no pass by default: each way the key store writes is caught."""
    for write in (
        lambda: (tmp_path / "f").write_text("x"),
        lambda: os.open(tmp_path / "g", os.O_RDWR | os.O_CREAT, 0o600),
        lambda: (tmp_path / "d").mkdir(),
        lambda: os.chmod(tmp_path, 0o700),
    ):
        with pytest.raises(PermissionError), NoWrites() as seen:
            write()
        assert len(seen) == 1
    (tmp_path / "r").write_text("x")
    with NoWrites() as seen:
        assert (tmp_path / "r").read_text() == "x"  # reading is fine
    assert seen == []


# -- the key store as a tree: names, bytes, modes -------------------------------------------------


def tree(root: Path) -> dict[str, tuple[int, bytes | None]] | None:
    """Every path under ``root`` with its mode and, for files, its bytes (None: no ``root``)."""
    if not root.exists():
        return None
    found: dict[str, tuple[int, bytes | None]] = {".": (stat.S_IMODE(root.stat().st_mode), None)}
    for path in sorted(root.rglob("*")):
        mode = path.lstat().st_mode
        found[str(path.relative_to(root))] = (
            stat.S_IMODE(mode),
            path.read_bytes() if stat.S_ISREG(mode) else None,
        )
    return found


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> fleet_mod.Fleet:
    """Three converged nodes (a certificate mesh) and the key store their deploy wrote."""
    return fleet_mod.build(3, tmp_path_factory.mktemp("fleet3"), load())


@pytest.fixture(scope="module")
def keys_fleet(tmp_path_factory) -> fleet_mod.Fleet:
    return fleet_mod.build(3, tmp_path_factory.mktemp("keys3"), load(), mesh="keys")


def _stores(fleet: fleet_mod.Fleet, tmp_path: Path, which: str) -> Path:
    """TRAINFLEET_HOME: the fleet's own (converged) or a new, empty one."""
    return fleet.home if which == "converged" else tmp_path / "empty-home"


def _fingerprints(fleet: fleet_mod.Fleet) -> dict[str, Any]:
    users = fleet.cluster.mesh_users
    return {
        name: fleet_mod.parse_bundle(
            "fingerprint", a.fingerprint, users, a.targets, cluster_blocks(fleet.cluster)
        )
        for name, a in fleet.converged.items()
    }


@pytest.mark.parametrize("which", ["converged", "empty"])
@pytest.mark.parametrize("mesh", ["certificates", "keys"])
def test_drift_leaves_the_key_store_byte_identical(
    fleet, keys_fleet, tmp_path, monkeypatch, which, mesh
):
    """Drift as its pyinfra run does it (``_report``, the nodes' answers given to it): the key
    store is what it was, and an empty store's folder is not even made."""
    chosen = fleet if mesh == "certificates" else keys_fleet
    home = _stores(chosen, tmp_path, which)
    monkeypatch.setenv("TRAINFLEET_HOME", str(home))
    monkeypatch.setenv("TRAINFLEET_DRIFT_JSON", "")
    before = tree(home / "keys")
    fingerprints = _fingerprints(chosen)
    monkeypatch.setattr(drift_check, "gather_fact", lambda *a, **k: fingerprints)
    monkeypatch.setattr(drift_check, "refused_sudo", lambda state: {})
    report = drift_check._report(None, chosen.cluster)
    assert tree(home / "keys") == before
    if which == "converged":
        assert report.findings == []
    else:  # the missing key material is named, not made
        problems = {f.property: f.observed for f in report.findings}
        assert "the key store has no" in problems["ssh mesh plan (root)"]
        assert ("the key store has no cluster CA" in problems.get("sshd mesh plan", "")) == (
            mesh == "certificates"
        )
    # The comparison itself (the benchmark's drift, on the fleet's store) writes nothing at all.
    before = tree(chosen.home / "keys")
    with NoWrites() as seen:
        assert fleet_mod.offline_drift(chosen).findings == []
    assert seen == [] and tree(chosen.home / "keys") == before


@pytest.mark.parametrize("which", ["converged", "empty"])
def test_the_preflight_reads_the_key_store_and_leaves_it_byte_identical(
    fleet, tmp_path, monkeypatch, which
):
    home = _stores(fleet, tmp_path, which)
    monkeypatch.setenv("TRAINFLEET_HOME", str(home))
    before = tree(home / "keys")
    monkeypatch.setattr(mesh_stage, "run_everywhere", lambda *a, **k: {})
    report = PreflightReport(fleet.cluster.name, [n.name for n in fleet.cluster.nodes])
    mesh_stage.run_ssh_mesh(None, fleet.cluster, report, {n.name for n in fleet.cluster.nodes})
    assert tree(home / "keys") == before
    plan = hygiene_stage.preflight_plan(None, fleet.cluster, networks={})
    assert tree(home / "keys") == before and plan.nodes


@pytest.mark.parametrize("mesh", ["certificates", "keys"])
def test_the_plan_builder_performs_no_writes(fleet, keys_fleet, tmp_path, mesh):
    """prepare_keys writes (it is the deploy's one writer); plan_cluster, given what it
    prepared or a snapshot of an empty store, writes nothing at all."""
    chosen = fleet if mesh == "certificates" else keys_fleet
    cluster = chosen.cluster
    gathered = plan_inputs(
        {
            name: fleet_mod.parse_bundle("deploy_state", a.deploy_state, cluster.mesh_users)
            for name, a in chosen.fresh.items()
        }
    )
    store = KeyStore(cluster.name, root=tmp_path / "keys")
    names = [n.name for n in cluster.nodes]
    empty = store.snapshot(cluster.mesh_users, names)
    with NoWrites() as seen:
        plan = plan_cluster(cluster, gathered, empty)
    assert seen == [] and not (tmp_path / "keys").exists()
    assert all(u.problems for p in plan.nodes.values() for u in p.ssh_mesh.users)
    material = prepare_keys(store, cluster, gathered)
    assert (tmp_path / "keys").exists()
    with NoWrites() as seen:
        plan = plan_cluster(cluster, gathered, material)
    assert seen == []
    assert not any(u.problems for p in plan.nodes.values() for u in p.ssh_mesh.users)
    assert all(u.identity for p in plan.nodes.values() for u in p.ssh_mesh.users)


def test_constructing_or_snapshotting_a_store_writes_nothing(tmp_path):
    root = tmp_path / "keys"
    store = KeyStore("c1", root=root)
    store.keypair("root", "a")
    store.keypair("root", "gone")
    (root / "c1" / "root" / "a.pub").write_text("stale\n")  # the deploy would rewrite it
    before = tree(root)
    with NoWrites() as seen:
        again = KeyStore("c1", root=root)
        material = again.snapshot(["root"], ["a", "b"])
        KeyStore("c2", root=tmp_path / "nowhere").snapshot(["root"], ["a"])
    assert seen == [] and tree(root) == before and not (tmp_path / "nowhere").exists()
    assert material.keypair("root", "a").public.startswith("ssh-ed25519 ")  # from its private half
    assert material.keypair("root", "a") == store.keypair("root", "a")
    assert material.keypair("root", "b") is None and material.missing["root"] == ("b",)
    assert material.ca is None


def test_drift_of_a_reimaged_node_names_it_and_revokes_nothing(fleet, monkeypatch):
    """A node presenting new host keys: drift expects the KRL the next deploy will write (its
    old keys revoked) and names every node's; the revocation itself is the deploy's
    (prepare_keys), not drift's."""
    monkeypatch.setenv("TRAINFLEET_HOME", str(fleet.home))
    monkeypatch.setenv("TRAINFLEET_DRIFT_JSON", "")
    fingerprints = _fingerprints(fleet)
    victim = sorted(fingerprints)[1]
    fingerprints[victim]["host_keys"] = [public_key()]
    monkeypatch.setattr(drift_check, "gather_fact", lambda *a, **k: fingerprints)
    monkeypatch.setattr(drift_check, "refused_sudo", lambda state: {})
    before = tree(fleet.home / "keys")
    report = drift_check._report(None, fleet.cluster)
    assert tree(fleet.home / "keys") == before
    assert {f.node for f in report.findings if f.property == "sshd mesh files"} == set(fingerprints)
