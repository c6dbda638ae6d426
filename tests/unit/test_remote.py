"""The one write primitive, run for real (sh, setpriv, flock, mktemp) on this machine's own
files: compare-and-swap, atomic, root never through a link or where others write, a user's
file written as that user. The lab proves the same on nodes (tests/lab/test_hostile_user.py)."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand

from operations import remote
from operations.remote import (
    ABSENT,
    ANY,
    INLINE_LIMIT,
    RUN_DIR,
    fail_command,
    sha256,
    write_command,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="writes as root and as another user")


def run(commands) -> subprocess.CompletedProcess[str]:
    """Run the commands here as pyinfra would on a node; an upload is a local file copy."""
    result = None
    for command in commands if isinstance(commands, list) else [commands]:
        if isinstance(command, FileUploadCommand):
            command.src.seek(0)
            Path(command.dest).write_bytes(command.src.read())
            continue
        result = subprocess.run(
            ["sh", "-c", command.get_raw_value()], capture_output=True, text=True
        )
        if result.returncode:
            return result
    return result


@pytest.fixture
def nobody_dir():
    """A directory owned by `nobody`, the stand-in for a node user (cleaned up after)."""
    path = Path(tempfile.mkdtemp(prefix="tf-nobody-"))
    os.chmod(path, 0o755)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)
    yield path
    shutil.rmtree(path)


def test_a_new_file_is_created_with_its_mode_and_missing_directories(tmp_path):
    target = tmp_path / "a" / "b" / "file"
    assert run(write_command(str(target), "x\n", expect=ABSENT, mode="640")).returncode == 0
    assert target.read_text() == "x\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_the_file_is_replaced_only_if_it_still_has_the_bytes_that_were_read(tmp_path):
    target = tmp_path / "hosts"
    target.write_text("127.0.0.1 localhost\n")
    read = sha256(target.read_bytes())
    target.write_text("127.0.0.1 localhost\n10.0.0.1 added-meanwhile\n")  # the user, after the fact

    result = run(write_command(str(target), "new\n", expect=read))

    assert result.returncode == 1 and "changed after it was read" in result.stderr
    assert target.read_text() == "127.0.0.1 localhost\n10.0.0.1 added-meanwhile\n"
    assert (
        run(write_command(str(target), "new\n", expect=sha256(target.read_bytes()))).returncode == 0
    )
    assert target.read_text() == "new\n"


def test_a_file_that_appeared_after_the_read_is_not_overwritten(tmp_path):
    target = tmp_path / "new"
    target.write_text("someone's\n")
    result = run(write_command(str(target), "ours\n", expect=ABSENT))
    assert result.returncode == 1 and target.read_text() == "someone's\n"


def test_an_existing_file_keeps_its_mode_and_no_temp_file_is_left(tmp_path):
    target = tmp_path / "hostname"
    target.write_text("old\n")
    os.chmod(target, 0o600)
    assert run(write_command(str(target), "gpu-a01\n", expect=ANY, mode="644")).returncode == 0
    assert target.read_text() == "gpu-a01\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hostname"]


def test_any_bytes_survive_the_trip(tmp_path):
    target = tmp_path / "f"
    data = b"no final newline \r\n\x00\xff\xfe ' \" $(id) `id` \\"
    assert run(write_command(str(target), data, expect=ABSENT)).returncode == 0
    assert target.read_bytes() == data


@pytest.fixture
def root_tree():
    """A directory whose every parent up to / is root's alone (/run): root's dotfiles live in
    such a tree (/root), unlike pytest's tmp_path under the world-writable /tmp."""
    path = Path(tempfile.mkdtemp(prefix="tf-root-", dir="/run"))
    (path / ".ssh").mkdir(mode=0o700)
    (path / "dotfiles").mkdir(mode=0o700)
    yield path
    shutil.rmtree(path)


@needs_root
def test_roots_link_to_roots_own_dotfile_stays_a_link_and_its_target_gets_the_content(root_tree):
    real = root_tree / "dotfiles" / "ssh_config"
    real.write_text("Host *\n")
    os.chmod(real, 0o600)
    link = root_tree / ".ssh" / "config"
    link.symlink_to("../dotfiles/ssh_config")

    result = run(write_command(str(link), "Host n1\nHost *\n", expect=sha256(b"Host *\n")))

    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and os.readlink(link) == "../dotfiles/ssh_config"
    assert real.read_text() == "Host n1\nHost *\n"
    assert (real.stat().st_uid, stat.S_IMODE(real.stat().st_mode)) == (0, 0o600)
    assert sorted(p.name for p in (root_tree / "dotfiles").iterdir()) == ["ssh_config"]


@needs_root
def test_a_chain_of_roots_links_through_a_linked_directory_is_followed(root_tree):
    (root_tree / "dots").symlink_to("dotfiles")  # a link to a directory on the way
    (root_tree / "dotfiles" / "real").write_text("old\n")
    (root_tree / "dotfiles" / "ssh_config").symlink_to(root_tree / "dots" / "real")
    (root_tree / ".ssh" / "config").symlink_to(root_tree / "dots" / "ssh_config")

    assert (
        run(write_command(str(root_tree / ".ssh" / "config"), "new\n", expect=ANY)).returncode == 0
    )
    assert (root_tree / "dotfiles" / "real").read_text() == "new\n"
    assert (root_tree / "dotfiles" / "ssh_config").is_symlink() and (
        root_tree / ".ssh" / "config"
    ).is_symlink()


def _through_tmp(root_tree: Path) -> Path:
    # /tmp (world-writable, sticky) on the way, even to a root-only directory in it
    tmp = Path(tempfile.mkdtemp(prefix="tf-root-"))
    (tmp / "ssh_config").write_text("keep\n")
    return tmp / "ssh_config"


def _user_writable_dir(root_tree: Path) -> Path:
    shared = root_tree / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    (shared / "ssh_config").write_text("keep\n")
    return shared / "ssh_config"


def _users_own_dir(root_tree: Path) -> Path:
    home = root_tree / "home"
    home.mkdir()
    (home / "ssh_config").write_text("keep\n")
    os.chown(home, pwd.getpwnam("nobody").pw_uid, -1)
    return home / "ssh_config"


def _users_link(root_tree: Path) -> Path:
    (root_tree / "dotfiles" / "ssh_config").write_text("keep\n")
    hop = root_tree / "dotfiles" / "hop"
    hop.symlink_to("ssh_config")
    os.lchown(hop, pwd.getpwnam("nobody").pw_uid, -1)
    return hop


def _users_file(root_tree: Path) -> Path:
    target = root_tree / "dotfiles" / "ssh_config"
    target.write_text("keep\n")
    os.chown(target, pwd.getpwnam("nobody").pw_uid, -1)
    return target


@needs_root
@pytest.mark.parametrize(
    "plant, why",
    [
        (_through_tmp, "is a symbolic link through /tmp, which is not root's alone"),
        (_user_writable_dir, "/shared, which is not root's alone"),
        (_users_own_dir, "/home, which is not root's alone"),
        (_users_link, "/dotfiles/hop, a link not owned by root"),
        (_users_file, "/dotfiles/ssh_config, which is not root's alone"),
    ],
)
def test_roots_link_anywhere_another_user_could_redirect_it_is_refused_untouched(
    root_tree, plant, why
):
    target = plant(root_tree)
    link = root_tree / ".ssh" / "config"
    link.symlink_to(target)
    real = target.resolve()
    before = (real.read_bytes(), real.stat().st_uid, real.stat().st_mode)
    try:
        result = run(write_command(str(link), "pwned\n", expect=ANY))
        assert result.returncode == 1
        assert f"trainfleet: {link}: " in result.stderr and why in result.stderr, result.stderr
        assert "nothing was changed" in result.stderr
        assert (
            link.is_symlink()
            and (real.read_bytes(), real.stat().st_uid, real.stat().st_mode) == before
        )
        assert (
            sorted(p.name for p in real.parent.iterdir() if p.name.startswith(".trainfleet")) == []
        )
    finally:
        if str(real).startswith("/tmp/tf-root-"):
            shutil.rmtree(real.parent)


@needs_root
def test_root_refuses_a_directory_others_can_write(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result = run(write_command(str(shared / "f"), "x\n", expect=ABSENT))
    assert result.returncode == 1 and "writable by others" in result.stderr
    assert not (shared / "f").exists()


@needs_root
def test_a_users_file_is_written_as_the_user_so_a_link_to_a_root_file_gives_nothing(
    nobody_dir, tmp_path
):
    secret = tmp_path / "root-only"
    secret.write_text("root's\n")
    os.chmod(secret, 0o644)
    planted = nobody_dir / "authorized_keys"
    planted.symlink_to(secret)
    before = secret.stat()

    result = run(write_command(str(planted), "pwned\n", expect=ANY, user="nobody"))

    assert result.returncode == 1
    after = secret.stat()
    assert secret.read_text() == "root's\n"
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )


@needs_root
def test_a_link_the_user_owns_stays_a_link_and_its_target_gets_the_content(nobody_dir):
    dotfiles = nobody_dir / "dotfiles"
    dotfiles.mkdir()
    real = dotfiles / "ssh_config"
    real.write_text("Host *\n")
    link = nobody_dir / "config"
    link.symlink_to(real)
    for path in (dotfiles, real):
        os.chown(path, pwd.getpwnam("nobody").pw_uid, pwd.getpwnam("nobody").pw_gid)

    result = run(
        write_command(str(link), "Host n1\nHost *\n", expect=sha256(b"Host *\n"), user="nobody")
    )

    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and real.read_text() == "Host n1\nHost *\n"
    assert real.stat().st_uid == pwd.getpwnam("nobody").pw_uid


@needs_root
def test_a_secret_is_uploaded_to_a_unique_root_only_name_and_never_on_the_command_line(tmp_path):
    target = tmp_path / "id_trainfleet"
    commands = write_command(
        str(target), "PRIVATE KEY MATERIAL\n", expect=ABSENT, mode="600", secret=True
    )
    assert not any(
        "PRIVATE KEY MATERIAL" in c.get_raw_value()
        for c in commands
        if not isinstance(c, FileUploadCommand)
    )
    staged = [c.dest for c in commands if isinstance(c, FileUploadCommand)]
    assert len(staged) == 1 and staged[0].startswith(RUN_DIR + "/stage.")
    assert staged != [
        c.dest
        for c in write_command(str(target), "x", secret=True)
        if isinstance(c, FileUploadCommand)
    ]

    assert run(commands).returncode == 0
    assert (
        target.read_text() == "PRIVATE KEY MATERIAL\n"
        and stat.S_IMODE(target.stat().st_mode) == 0o600
    )
    assert not Path(staged[0]).exists()
    run_dir = Path(RUN_DIR).stat()
    assert (run_dir.st_uid, stat.S_IMODE(run_dir.st_mode)) == (0, 0o700)


def test_content_too_large_for_one_argument_is_uploaded(tmp_path):
    target = tmp_path / "known_hosts"
    content = "".join(f"node{i} ssh-ed25519 {'A' * 68}\n" for i in range(INLINE_LIMIT // 80 + 10))
    commands = write_command(str(target), content, expect=ABSENT)
    assert any(isinstance(c, FileUploadCommand) for c in commands)
    assert run(commands).returncode == 0 and target.read_text() == content


@needs_root
def test_a_write_waits_for_the_node_lock_then_fails_naming_the_holder(tmp_path, monkeypatch):
    monkeypatch.setattr(remote, "LOCK_WAIT", 1)
    assert run(remote.run_dir_command()).returncode == 0
    with open(f"{RUN_DIR}/lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        Path(f"{RUN_DIR}/holder").write_text("controller-b pid 4242 run abc\n")
        result = run(write_command(str(tmp_path / "f"), "x\n", expect=ABSENT))
    assert result.returncode == 1
    assert (
        "another trainfleet run holds this node's lock: controller-b pid 4242 run abc"
        in result.stderr
    )
    assert not (tmp_path / "f").exists()
    assert run(write_command(str(tmp_path / "f"), "x\n", expect=ABSENT)).returncode == 0


def test_fail_command_fails_with_its_message():
    result = run(fail_command("node is broken: 'quoted' $x"))
    assert (
        result.returncode == 1
        and result.stderr.strip() == "trainfleet: node is broken: 'quoted' $x"
    )
