"""A mesh user's process never inherits root's environment (nor, through ``sudo -E``, the
admin's): the writer (setpriv), the reader of a user's files (tf_as) and the mesh probe (su)
are run for real here, as `nobody`, from a polluted environment, and report what they see.
The lab proves the probe on a node whose root login carries a marker (test_hostile_user.py)."""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from facts.managed_block_facts import AS_USER_FN, USER_PATH
from facts.ssh_mesh_facts import SshMeshProof
from operations.remote import ABSENT, as_user_command, write_command

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs commands as another user")

# What root's (or the admin's) environment may carry that a user must not get.
POLLUTION = {
    "TF_LEAK": "root's secret",
    "SSH_AUTH_SOCK": "/tmp/ssh-root/agent.1",
    "LD_LIBRARY_PATH": "/opt/root-libs",
    "AWS_SECRET_ACCESS_KEY": "root-token",
}
# What every such process gets: the fixed set, plus the variable sh sets itself.
FIXED = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "PWD"}
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def nobody_dir():
    """A directory `nobody` can write (the user's own), cleaned up after."""
    path = Path(tempfile.mkdtemp(prefix="tf-env-"))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    yield path
    shutil.rmtree(path)


def polluted(extra_path: str = "") -> dict[str, str]:
    path = f"{extra_path}:{os.environ['PATH']}" if extra_path else os.environ["PATH"]
    return {**os.environ, **POLLUTION, "PATH": path}


def run_sh(script: str, *args: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> str:
    result = subprocess.run(
        [*prefix, "sh", "-c", script, "trainfleet", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def assert_fixed(seen: dict[str, str], also: set[str] = frozenset()) -> None:
    assert not POLLUTION.keys() & seen.keys(), seen
    assert set(seen) <= FIXED | also, seen
    assert (seen["PATH"], seen["HOME"], seen["USER"], seen["LOGNAME"]) == (
        USER_PATH,
        NOBODY.pw_dir,
        "nobody",
        "nobody",
    )


def test_a_script_run_as_a_user_sees_only_the_fixed_environment():
    seen = parse_env(run_sh(as_user_command("nobody", "env").get_raw_value(), env=polluted()))
    assert_fixed(seen)
    assert seen["LANG"] == "C.UTF-8"


def test_the_writer_as_a_user_runs_nothing_from_roots_path_and_still_writes(nobody_dir):
    # A mktemp first in root's PATH records the environment it ran with: only the user's
    # writer calls mktemp, so it runs only if the writer inherited root's PATH.
    shadow = nobody_dir / "shadow"
    shadow.mkdir(mode=0o755)
    (shadow / "mktemp").write_text(
        f'#!/bin/sh\nenv > {nobody_dir}/leaked\nexec /usr/bin/mktemp "$@"\n'
    )
    os.chmod(shadow / "mktemp", 0o755)
    target = nobody_dir / "config"

    (command,) = write_command(str(target), "Host n1\n", expect=ABSENT, user="nobody")
    run_sh(command.get_raw_value(), env=polluted(str(shadow)))

    assert not (nobody_dir / "leaked").exists(), (nobody_dir / "leaked").read_text()
    assert target.read_text() == "Host n1\n" and target.stat().st_uid == NOBODY.pw_uid


def test_a_users_files_are_read_with_only_the_fixed_environment():
    line = run_sh(
        AS_USER_FN + 'tf_as "$1" "$2" env', str(NOBODY.pw_uid), str(NOBODY.pw_gid), env=polluted()
    )
    assert_fixed(parse_env(base64.b64decode(line).decode()))


def pam_environment() -> set[str]:
    """Names su's PAM session sets on this machine (pam_env's files, pam_mail)."""
    names = {"SHELL", "MAIL"}
    for path in ("/etc/environment", "/etc/default/locale"):
        if Path(path).exists():
            names |= {
                line.split("=", 1)[0].removeprefix("export ").strip()
                for line in Path(path).read_text().splitlines()
                if "=" in line and not line.startswith("#")
            }
    return names


def test_the_mesh_probe_runs_ssh_as_the_user_with_only_the_fixed_environment(nobody_dir, tmp_path):
    # ssh runs a `Match exec` command with its own environment: a client config that records
    # it, laid over the system one in a private mount namespace only this test sees.
    config = tmp_path / "ssh_config"
    config.write_text(f'Match exec "env > {nobody_dir}/probe-env; false"\n')
    command = SshMeshProof().command(user="nobody", peers=["peer.invalid"]).get_raw_value()
    mount = f'mount --bind {config} /etc/ssh/ssh_config && exec "$@"'

    run_sh(command, env=polluted(), prefix=("unshare", "-m", "sh", "-c", mount, "mount"))

    assert_fixed(parse_env((nobody_dir / "probe-env").read_text()), also=pam_environment())
