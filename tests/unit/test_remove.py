"""``trainfleet remove``'s plan, for real where it can be: each managed file is deployed into
and removed from here by the commands a node runs, every user byte kept or the file refused
untouched; the front door's mapping; drift's "not managed"; docs/remove.md lists every path
the code writes."""

from __future__ import annotations

import argparse
import ast
import base64
import importlib
import inspect
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from checks.unmanaged import fold_unmanaged, not_managed
from facts import remove_facts
from facts.managed_block_facts import block_state, file_line
from facts.remove_facts import (
    BLOCK_FILES,
    HOME_BLOCK_FILES,
    OWNED_FILES,
    RemoveFiles,
    launch_entries,
)
from facts.ssh_mesh_facts import _HOST_CERT_PATHS
from operations import remove_ops
from operations.remote import FailCommand
from tests.unit.test_managed_files import read, states, user_text
from tests.unit.test_remote import nobody_dir, run  # noqa: F401  (nobody_dir: a fixture)
from trainfleet import front_door
from trainfleet.blocks import markers
from trainfleet.capabilities.launchers import KEPT_NAMES
from trainfleet.capabilities.stack import cuda_repo_files
from trainfleet.compare import Finding, Report
from trainfleet.defaults import LAUNCH_DIR

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs/remove.md").read_text()
NEW = ["new line 1", "new line 2"]
ALL_BLOCK_FILES = [*BLOCK_FILES, *HOME_BLOCK_FILES]
TOP = {".ssh/config", ".openmpi/mca-params.conf"}  # the deploy writes these blocks first


def deployed(path: Path, block: remove_facts.BlockFile, original: bytes | None) -> None:
    """The file as the deploy leaves it: ``original`` with trainfleet's block in it."""
    if original is not None:
        path.write_bytes(original)
    top = block.path in TOP
    result = run(
        remove_ops.block_change(str(path), block.purpose, read(path, block.purpose), NEW, top=top)
    )
    assert result.returncode == 0, result.stderr


def converging(purpose: str) -> list[str]:
    return [name for name, (_, converges) in states(purpose).items() if converges]


CASES = [(b, s) for b in ALL_BLOCK_FILES for s in converging(b.purpose)]


@pytest.mark.parametrize(("block", "state"), CASES, ids=[f"{b.path} | {s}" for b, s in CASES])
def test_a_block_comes_out_with_every_user_byte_as_before_the_deploy(tmp_path, block, state):
    original, _ = states(block.purpose)[state]
    target = tmp_path / "file"
    deployed(target, block, original)

    commands = remove_ops.block_out(
        str(target), block.purpose, read(target, block.purpose), block.drop_if_empty
    )
    result = run(commands)

    assert result.returncode == 0, result.stderr
    kept = user_text(original, block.purpose) if original is not None else ""
    had_block = original is not None and user_text(original, block.purpose) != original.decode(
        "utf-8", "surrogateescape"
    )
    if not had_block and block.path not in TOP and kept and not kept.endswith("\n"):
        kept += "\n"  # the deploy gave the last user line its newline before its block
    if block.drop_if_empty and kept == "":
        assert not target.exists()  # a file trainfleet made for its block alone
    else:
        assert target.read_bytes() == kept.encode("utf-8", "surrogateescape")
    again = read(target, block.purpose)
    assert remove_ops.block_out(str(target), block.purpose, again, block.drop_if_empty) == []


AMBIGUOUS = [(b, s) for b in ALL_BLOCK_FILES for s, (_, ok) in states(b.purpose).items() if not ok]


@pytest.mark.parametrize(
    ("block", "state"), AMBIGUOUS, ids=[f"{b.path} | {s}" for b, s in AMBIGUOUS]
)
def test_a_file_whose_markers_are_ambiguous_is_refused_untouched_naming_it(tmp_path, block, state):
    original, _ = states(block.purpose)[state]
    target = tmp_path / "file"
    target.write_bytes(original)

    commands = remove_ops.block_out(str(target), block.purpose, read(target, block.purpose), True)

    assert len(commands) == 1 and isinstance(commands[0], FailCommand)
    result = run(commands)
    assert result.returncode == 1 and f"{target}:" in result.stderr
    assert "nothing was changed" in result.stderr
    assert target.read_bytes() == original


def test_a_users_file_is_rewritten_and_deleted_as_the_user(nobody_dir):  # noqa: F811
    purpose = HOME_BLOCK_FILES[0].purpose
    begin, end = markers(purpose)
    mine = nobody_dir / "authorized_keys"
    mine.write_text(f"ssh-ed25519 AAAA user@laptop\n{begin}\nmesh\n{end}\n")
    only = nobody_dir / "config"
    only.write_text(f"{begin}\nmesh\n{end}\n")
    for path in (mine, only):
        os.chown(path, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)

    for path in (mine, only):
        commands = remove_ops.block_out(str(path), purpose, read(path, purpose), True, "nobody")
        assert all("TF_AS=nobody" in c.get_raw_value() for c in commands)
        assert run(commands).returncode == 0

    assert mine.read_text() == "ssh-ed25519 AAAA user@laptop\n"
    assert mine.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    assert not only.exists()


def _read(path: Path) -> dict:
    if path.is_symlink():
        return {"state": "regular", "link": True, "data": path.read_bytes()}
    if not path.exists():
        return {"state": "missing", "link": False, "data": None}
    return {"state": "regular", "link": False, "data": path.read_bytes()}


def test_an_owned_file_goes_and_one_trainfleet_owns_by_content_only_while_it_holds_that(tmp_path):
    ours, changed = tmp_path / "rcmd_default", tmp_path / "rcmd_default.user"
    ours.write_text("ssh\n")
    changed.write_text("rsh\n")
    assert run(remove_ops.owned_file_out(str(ours), _read(ours), "ssh\n")).returncode == 0
    assert not ours.exists()
    assert remove_ops.owned_file_out(str(ours), _read(ours), "ssh\n") == []  # gone: no change
    assert remove_ops.owned_file_out(str(changed), _read(changed), "ssh\n") == []
    named = tmp_path / "trainfleet-nccl.sh"
    named.write_text("export NCCL_SOCKET_IFNAME=eth0\n")
    assert run(remove_ops.owned_file_out(str(named), _read(named), None)).returncode == 0
    assert not named.exists()
    link = tmp_path / "trainfleet-pdsh.sh"
    link.symlink_to(changed)
    (refused,) = remove_ops.owned_file_out(str(link), _read(link), None)
    assert isinstance(refused, FailCommand) and changed.read_text() == "rsh\n"


def test_a_file_changed_after_it_was_read_is_not_deleted(tmp_path):
    target = tmp_path / "trainfleet-gcc.sh"
    target.write_text("source /opt/rh/gcc-toolset-12/enable\n")
    commands = remove_ops.owned_file_out(str(target), _read(target), None)
    target.write_text("# the admin's line, written since\n")
    result = run(commands)
    assert result.returncode == 1 and "changed after it was read" in result.stderr
    assert target.exists()


def test_the_launcher_files_go_and_a_users_file_keeps_its_folder():
    entries = [("f", "hostfile"), ("d", "healthy"), ("f", "healthy/hostfile"), ("f", "notes.txt")]
    (command,) = remove_ops.launch_dir_out(entries, link=False)
    args = command.get_raw_value()
    assert "hostfile" in args and "healthy/hostfile" in args and "notes.txt" not in args
    assert remove_ops.launch_dir_out([("f", "notes.txt")], link=False) == []  # the user's alone
    assert remove_ops.launch_dir_out(None, link=False) == []
    (refused,) = remove_ops.launch_dir_out(None, link=True)
    assert isinstance(refused, FailCommand)
    assert set(KEPT_NAMES) >= {"hostfile", "healthy/hostfile", "README", ".deepspeed_env"}


def test_holds_are_released_packages_stay_and_the_venv_goes_only_when_asked():
    (apt,) = remove_ops.holds_out(["libnccl2", "libnccl-dev"], [])
    assert apt.get_raw_value() == "apt-mark unhold libnccl2 libnccl-dev"
    (dnf,) = remove_ops.holds_out([], ["libnccl"])
    assert dnf.get_raw_value().endswith('versionlock delete "$@"; fi\' trainfleet libnccl')
    assert remove_ops.holds_out([], []) == []
    assert not any("remove" in c.get_raw_value() for c in [apt, dnf])  # no package is removed
    assert remove_ops.venv_out("yes", purge=False) == []
    assert remove_ops.venv_out("missing", purge=True) == []
    (purge,) = remove_ops.venv_out("yes", purge=True)
    assert "/opt/trainfleet/venv" in purge.get_raw_value() and "-r" in purge.get_raw_value()
    (refused,) = remove_ops.venv_out("link", purge=True)
    assert isinstance(refused, FailCommand)


def test_a_step_the_spec_does_not_manage_keeps_its_holds_they_are_the_clusters_own():
    held = ["cuda-toolkit-12-4", "libnccl2", "nvidia-fabricmanager-550"]
    pinned = remove_ops.stack_packages({"cuda": "12.4", "nccl": "2.21.5-1"})
    assert remove_ops.held_by(pinned, True, held) == held
    assert remove_ops.held_by((), True, held) == ["nvidia-fabricmanager-550"]
    assert remove_ops.held_by(pinned, False, held) == ["cuda-toolkit-12-4", "libnccl2"]
    assert remove_ops.held_by((), False, held) == []
    # RHEL's fabric manager and its stack names are trainfleet's as well
    locked = ["cuda-toolkit-12-4", "libnccl", "nvidia-fabric-manager"]
    assert remove_ops.held_by(pinned, True, locked) == locked


def test_a_component_the_spec_leaves_out_keeps_the_clusters_own_hold():
    """The spec pins CUDA and NCCL, no cuDNN: the admin's hold on cuDNN is not trainfleet's."""
    held = ["cuda-toolkit-12-4", "libcudnn9-cuda-12", "libnccl-dev", "libnccl2"]
    pinned = remove_ops.stack_packages({"cuda": "12.4", "cudnn": None, "nccl": "2.21.5-1"})
    assert remove_ops.held_by(pinned, False, held) == [
        "cuda-toolkit-12-4",
        "libnccl-dev",
        "libnccl2",
    ]
    with_cudnn = remove_ops.stack_packages(
        {"cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5-1"}
    )
    assert remove_ops.held_by(with_cudnn, False, held) == held


def test_a_users_empty_folder_in_the_launcher_folder_keeps_it_and_a_rerun_changes_nothing():
    assert remove_ops.launch_dir_out([("d", "mine")], link=False) == []
    assert remove_ops.launch_dir_out([("d", "healthy"), ("d", "healthy/mine")], link=False) == []
    assert remove_ops.launch_dir_out([("d", "healthy"), ("f", "healthy/x.txt")], link=False) == []
    (command,) = remove_ops.launch_dir_out([("d", "healthy")], link=False)  # trainfleet's own
    assert command.get_raw_value().endswith(" /etc/trainfleet/launch /etc/trainfleet")


def test_the_acs_unit_is_disabled_deleted_and_systemd_told():
    delete = [remove_ops.delete_command("/etc/systemd/system/trainfleet-acs.service")]
    commands = [c.get_raw_value() for c in remove_ops.acs_unit_out(delete, "enabled")]
    assert commands[0] == "systemctl disable trainfleet-acs.service"
    assert commands[-1] == "systemctl daemon-reload"
    assert remove_ops.acs_unit_out([], "enabled") == []  # no unit file: nothing
    assert remove_ops.acs_unit_out(delete, None) == delete  # no systemd to tell


def mesh_user(uid: str, home: str, **files) -> dict:
    begin, end = markers(HOME_BLOCK_FILES[0].purpose)
    key = {"mode": "600", "owner": home.rsplit("/", 1)[-1], "sha256": "0" * 64}
    return {
        "exists": True, "home": home, "group": "g", "uid": uid, "ssh_dir": key,
        "identity": key, "identity_pub": key, "certificate": files.get("certificate"),
        "authorized": block_state(
            {"state": "regular", "link": False, "data": f"mine\n{begin}\nk\n{end}\n".encode()},
            HOME_BLOCK_FILES[0].purpose,
        ),
        "config": block_state(None, HOME_BLOCK_FILES[1].purpose),
    }  # fmt: skip


def test_a_mesh_users_key_and_blocks_go_as_that_user_roots_as_root():
    alice = remove_ops.home_files_out("alice", mesh_user("1000", "/home/alice"), None)
    raw = [c.get_raw_value() for c in alice]
    assert all("TF_AS=alice" in c for c in raw) and len(raw) == 3  # the block, the key pair
    assert any("/home/alice/.ssh/id_trainfleet.pub" in c for c in raw)
    root = remove_ops.home_files_out("root", mesh_user("0", "/root", certificate="c"), None)
    assert all("TF_AS= " in c.get_raw_value() for c in root) and len(root) == 4
    gone = dict(mesh_user("1000", "/home/bob"), exists=False)
    assert remove_ops.home_files_out("bob", gone, None) == []
    # a ~/.ssh that another user owns: refused as the deploy refuses it, nothing changed
    theirs = dict(mesh_user("1000", "/home/bob"), ssh_dir={"mode": "700", "owner": "eve"})
    (refused,) = remove_ops.home_files_out("bob", theirs, None)
    assert isinstance(refused, FailCommand) and "belongs to eve, not bob" in refused.get_raw_value()


def test_one_file_that_cannot_be_split_holds_back_the_whole_step_naming_it():
    """/etc/hosts has a lone BEGIN marker; the node also holds a launcher file and a hold: the
    step refuses, naming the file, and changes nothing else (drift still sees every trace)."""
    begin, _ = markers(BLOCK_FILES[0].purpose)
    files = {
        f.path: {"state": "missing", "link": False, "data": None}
        for f in (*BLOCK_FILES, *OWNED_FILES)
    }
    files[BLOCK_FILES[0].path] = {"state": "regular", "link": False, "data": f"{begin}\n".encode()}
    found = {"files": files, "launch": [("f", "hostfile")], "launch_link": False, "venv": "yes",
             "unit": None, "held": ["libnccl2"], "locked": []}  # fmt: skip
    (refused,) = remove_ops.system_files_out(found, False, ["libnccl2"])
    assert isinstance(refused, FailCommand) and BLOCK_FILES[0].path in refused.get_raw_value()
    files[BLOCK_FILES[0].path] = {"state": "missing", "link": False, "data": None}
    assert len(remove_ops.system_files_out(found, False, ["libnccl2"])) == 2  # fixed: both go


def test_the_fact_reads_this_machine_and_keeps_only_trainfleets_holds():
    fact = RemoveFiles()
    out = subprocess.run(
        ["sh", "-c", fact.command().get_raw_value()], capture_output=True, text=True, check=True
    )
    found = fact.process(out.stdout.splitlines())
    assert set(found["files"]) == {f.path for f in (*BLOCK_FILES, *OWNED_FILES)}
    listing = base64.b64encode(b"f hostfile\0d healthy\0").decode()
    lines = [
        *(file_line(f.path, None) for f in (*BLOCK_FILES, *OWNED_FILES)),
        f"launch {listing}", "venv yes", "unit enabled",
        "hold libnccl2", "hold vim", "lock libnccl-0:2.21.5-1+cuda12.4.*", "lock 0:zsh-5.8-1.*",
    ]  # fmt: skip
    found = fact.process(lines)
    assert found["held"] == ["libnccl2"] and found["locked"] == ["libnccl"]
    assert found["launch"] == [("f", "hostfile"), ("d", "healthy")] and found["unit"] == "enabled"
    assert launch_entries("missing") is None
    with pytest.raises(FactProcessError):
        fact.process(lines[1:])  # a file not read is no proof it is absent


def test_the_front_door_maps_remove_and_purge_venv():
    parser = argparse.ArgumentParser()
    front_door.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["remove", "x.yml", "-y", "--purge-venv", "--limit", "gpu-a01"])
    argv, _ = front_door.command("remove", args)
    assert argv[1:] == [
        "-y", "--limit", "gpu-a01", "--data", "trainfleet_purge_venv=1",
        "inventories/from_spec.py", "deploy/remove.py",
    ]  # fmt: skip
    dry = parser.parse_args(["remove", "x.yml", "--dry"])
    assert front_door.command("remove", dry)[0][1:] == [
        "--dry", "inventories/from_spec.py", "deploy/remove.py"
    ]  # fmt: skip
    asks = parser.parse_args(["remove", "x.yml"])  # not read-only: pyinfra asks first
    assert "-y" not in front_door.command("remove", asks)[0]
    assert not front_door.DOORS["remove"].read_only


def test_drift_says_not_managed_once_instead_of_each_missing_block():
    empty = block_state(None, "x")
    with_block = dict(empty, block=["line"])
    users = ["root"]
    bare = {"hosts": empty, "known_hosts": empty, "launchers": {},
            "mesh_user:root": {"authorized": empty, "config": empty}}  # fmt: skip
    assert not_managed(bare, users)
    assert not not_managed(dict(bare, hosts=with_block), users)
    assert not not_managed(dict(bare, launchers={"hostfile": {}}), users)
    assert not not_managed({k: v for k, v in bare.items() if k != "known_hosts"}, users)
    # a lone BEGIN marker is trainfleet's trace too (the file remove refuses to touch)
    lone_begin = f"{markers('x')[0]}\nmine\n".encode()
    lone = block_state({"state": "regular", "link": False, "data": lone_begin}, "x")
    assert lone["broken"] and lone["block"] is None
    assert not not_managed(dict(bare, hosts=lone), users)
    findings = [
        Finding("n1", "hosts block", "spec", "absent", "3 lines"),
        Finding("n1", "ssh mesh keys", "spec", "absent", "3 lines"),
        Finding("n1", "hostname", "unique", "localhost", "n2"),
        Finding("n2", "hosts block", "spec", "absent", "3 lines"),
    ]
    report = Report("c", ["n1", "n2"], {}, list(findings))
    fold_unmanaged(report, {"n1": bare, "n2": dict(bare, hosts=with_block)}, users)
    assert [str(f) for f in report.findings_for("n1")] == [
        "hostname 'localhost' is not unique (n2)",
        "trainfleet is 'not managed', the spec wants 'managed'",
    ]
    assert report.findings_for("n2") == [findings[3]]


# -- docs/remove.md lists every path the code writes ------------------------------------------

ABSOLUTE = re.compile(r"^/(etc|opt|usr|run|var|root|home|srv)/")


def _paths(value: object) -> list[str]:
    values = value if isinstance(value, tuple) else (value,)
    return [v for v in values if isinstance(v, str) and ABSOLUTE.match(v) and ":" not in v]


def written_by_the_code() -> dict[str, str]:
    """Every absolute path the operations name: their modules' constants and their
    operations' default arguments, and every path in trainfleet/defaults.py (path -> where)."""
    found: dict[str, str] = {}
    modules = [importlib.import_module("trainfleet.defaults")] + [
        importlib.import_module(f"operations.{p.stem}")
        for p in sorted((REPO / "operations").glob("*.py"))
    ]
    for module in modules:
        for name, value in vars(module).items():
            for path in _paths(value):
                found.setdefault(path, f"{module.__name__}.{name}")
            if inspect.isfunction(value) and value.__module__ == module.__name__:
                for param in inspect.signature(value).parameters.values():
                    for path in _paths(param.default):
                        found.setdefault(path, f"{module.__name__}.{name}({param.name}=)")
    return found


def catalogue() -> set[str]:
    """What remove knows of: each path it takes a block out of, deletes, or leaves (and why)."""
    home = [f"~/{f.path}" for f in HOME_BLOCK_FILES] + [
        f"~/{p}" for p in remove_facts.HOME_KEY_FILES
    ]
    return {
        *(f.path for f in (*BLOCK_FILES, *OWNED_FILES)), *home, LAUNCH_DIR,
        *remove_facts.SSHD_STEP, *remove_facts.LEFT, *remove_facts.READ_ONLY,
    }  # fmt: skip


def test_every_path_the_code_writes_is_in_removes_catalogue():
    known = catalogue()
    missing = {path: where for path, where in written_by_the_code().items() if path not in known}
    assert missing == {}, "remove does not know these paths (facts/remove_facts.py)"


def test_docs_remove_lists_every_path_in_the_catalogue():
    absent = sorted(path for path in catalogue() if f"`{path}" not in DOCS)
    assert absent == [], "docs/remove.md does not list these"
    for block in ALL_BLOCK_FILES:
        assert f"(block `{block.purpose}`)" in DOCS, block


def test_the_catalogues_patterns_match_the_paths_the_code_makes():
    cert = re.escape(remove_facts.HOST_CERTIFICATES).replace("<type>", "[a-z0-9]+")
    assert all(re.fullmatch(cert, path) for path in _HOST_CERT_PATHS)
    patterns = [re.escape(p).replace("<distro>", "[a-z0-9]+").replace("<arch>", "[a-z0-9_]+")
                for p in remove_facts.CUDA_REPO_FILES]  # fmt: skip
    for os_ in (
        {"id": "ubuntu", "family": "debian", "version": "22.04", "package_manager": "apt"},
        {"id": "rocky", "family": "rhel", "version": "9.3", "package_manager": "dnf"},
    ):
        _, files = cuda_repo_files("https://mirror.example/cuda", os_)  # type: ignore[arg-type]
        (path,) = files
        assert any(re.fullmatch(p, path) for p in patterns), path


def test_every_managed_blocks_purpose_is_one_remove_takes_out():
    purposes = set()
    for source in sorted((REPO / "facts").glob("*.py")) + [REPO / "trainfleet/nccl.py"]:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(n.endswith("_PURPOSE") for n in names):
                    purposes.add(node.value.value)
    assert purposes and purposes <= {b.purpose for b in ALL_BLOCK_FILES}
