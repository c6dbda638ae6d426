"""The passwordless-sudo proof (facts/sudo_facts.py), run by a real shell against stand-in sudo
commands on PATH: what sudo prints decides, never a guess. The proof runs sudo exactly as
pyinfra runs a trainfleet sudo login's commands (same flags, through ``sh -c``)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from pyinfra.api import Config, Inventory, State
from pyinfra.api.facts import get_fact
from pyinfra.facts.server import Command

from facts.sudo_facts import probe_script, sudo_form, sudo_probe_command, sudo_refusal
from runtime.inventory import host_data
from trainfleet.spec import parse_cluster

SUDO_SPEC = """\
ssh: {user: admin, become: sudo}
nodes:
  - {name: a, address: 192.0.2.1}
"""
# A sudoers rule that lets `id` through without a password and asks one for anything else:
# sudo's first word that is not an option is the command it would run.
ONLY_ID = textwrap.dedent("""\
    while [ $# -gt 0 ]; do case $1 in -u) shift 2 ;; -*) shift ;; *) break ;; esac; done
    if [ "$1" = id ]; then exec "$@"; fi
    echo 'sudo: a password is required' >&2; exit 1
    """)


def sudo_data() -> dict:
    """The host data trainfleet's inventory makes for a sudo login."""
    cluster = parse_cluster(SUDO_SPEC)
    return host_data(cluster, cluster.nodes[0])


def sudo_state() -> tuple[State, object]:
    """A pyinfra state with the one host of a sudo spec (it is never connected to)."""
    inventory = Inventory(([("a", sudo_data())], {}))
    return State(inventory, Config()), inventory.get_host("a")


def probe_with(tmp_path: Path, sudo_script: str | None) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in (
        "sh",
        "printf",
        "tail",
        "tr",
        "cut",
        "id",
    ):  # the probe's own tools, and nothing else
        os.symlink(
            subprocess.run(
                ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
            ).stdout.strip()
            or f"/usr/bin/{tool}",
            bin_dir / tool,
        )
    if sudo_script is not None:
        sudo = bin_dir / "sudo"
        sudo.write_text("#!/bin/sh\n" + sudo_script)
        sudo.chmod(0o755)
    state, host = sudo_state()
    result = subprocess.run(
        [str(bin_dir / "sh"), "-c", probe_script(sudo_form(state, host).get_raw_value())],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        timeout=10,
    )
    assert result.returncode == 0 and result.stderr == ""  # one line on stdout, whatever happened
    return result.stdout.splitlines()


def test_the_proof_runs_sudo_exactly_as_pyinfra_runs_a_fact_of_the_host(tmp_path, monkeypatch):
    # pyinfra's local connector, with trainfleet's sudo settings, runs a real fact and the proof
    # through a stand-in sudo that records its arguments and runs the command.
    argv = tmp_path / "argv"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text(
        f"#!/bin/sh\nprintf '%s\\037' \"$@\" >> {argv}; echo >> {argv}\n"
        "while [ $# -gt 0 ]; do case $1 in -u) shift 2 ;; -*) shift ;; *) break ;; esac; done\n"
        'exec "$@"\n'
    )
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    sudo = {key: value for key, value in sudo_data().items() if key.startswith("_")}
    inventory = Inventory(([("@local", sudo)], {}))
    state = State(inventory, Config())
    host = inventory.get_host("@local")

    assert get_fact(state, host, Command, ("echo fact",)) == "fact"
    _, output = host.run_shell_command(sudo_probe_command(sudo_form(state, host)))

    assert sudo_refusal(output.stdout_lines, "admin") is None
    fact_argv, proof_argv = (line.split("\x1f")[:-1] for line in argv.read_text().splitlines())
    assert fact_argv[:-1] == proof_argv[:-1] == ["-H", "-n", "-E", "sh", "-c"]
    assert (fact_argv[-1], proof_argv[-1]) == ("echo fact", "id -u")


def test_a_rule_that_lets_only_id_through_is_refused(tmp_path):
    refusal = sudo_refusal(probe_with(tmp_path, ONLY_ID), "admin")
    assert refusal is not None and "sudo: a password is required" in refusal


def test_a_warning_before_root_still_proves_sudo(tmp_path):
    lines = probe_with(
        tmp_path,
        "echo 'sudo: unable to resolve host ip-10-0-0-1: Name or service not known' >&2\necho 0\n",
    )
    assert sudo_refusal(lines, "admin") is None


@pytest.mark.parametrize(
    "script, said",
    [
        ("echo 'sudo: a password is required' >&2\nexit 1\n", "sudo: a password is required"),
        (
            "echo 'sudo-rs: interactive authentication is required' >&2\nexit 1\n",
            "sudo-rs: interactive authentication",
        ),
        ("echo 1000\n", "1000"),  # ran, but not as root (a sudoers rule for another user)
        ("echo 0\nexit 1\n", "0"),  # said 0 but failed
        (None, "sudo: not found"),
    ],
)
def test_sudo_that_cannot_act_as_root_without_a_password_is_refused_with_what_it_said(
    tmp_path, script, said
):
    lines = probe_with(tmp_path, script)
    refusal = sudo_refusal(lines, "admin")
    assert refusal is not None and refusal.startswith("admin cannot act as root without a password")
    assert said in refusal


def test_no_answer_or_a_forged_ok_among_other_lines_is_a_refusal():
    assert sudo_refusal([], "admin") is not None
    assert sudo_refusal(["trainfleet-sudo: ok", "trainfleet-sudo: refused: x"], "admin") is not None


def test_what_sudo_said_is_escaped_before_it_is_printed():
    refusal = sudo_refusal(["trainfleet-sudo: refused: \x1b[2Jgone"], "admin")
    assert "\x1b" not in refusal and "\\x1b[2Jgone" in refusal
