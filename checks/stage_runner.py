"""Running a preflight stage: its scripts (files in preflight_stages/), its time bound, one
command per node run everywhere at once, each python in a private working directory.

Node users are adversaries: every python runs with ``-I`` in a fresh root-only directory
(never /tmp); a node whose directory could not be made safely ran nothing and is named.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pyinfra.api import State, StringCommand

from checks.preflight_report import Problem
from facts.shell import shell
from runtime.fanout import fan_out
from trainfleet.defaults import RUN_DIR

STAGES = (
    Path(__file__).resolve().parent / "preflight_stages"
)  # the scripts each stage runs on the nodes


def stage_script(name: str) -> str:
    return (STAGES / name).read_text()


BOUNDS = MappingProxyType(
    {
        "hygiene": 15,
        "reachability": 20,
        "collective": 25,
        "isolation": 20,
        "bandwidth": 30,  # s per round of node pairs (two rounds, three for an odd count)
        "smoke": 120,
    }
)  # s per stage (the smoke job's launchers import a lot)


# Every python the preflight starts gets a fresh working directory of its own under RUN_DIR
# (root's only), never /tmp or a home directory, whose files another user may have planted.
REFUSED = "trainfleet: refused to run: "  # the line a node prints when its RUN_DIR is not safe


STALE_MINUTES = 10  # a directory older than any stage is an interrupted run's: removed


def _checked_base(base: str) -> str:
    """Shell lines: ``base`` exists (made 0700 if missing) and is a real directory of ours with
    mode 700, else refuse; leftovers of interrupted runs in it are removed."""
    b = shlex.quote(base)
    refuse = shlex.quote(f"{REFUSED}{base} is not a directory of ours with mode 700")
    ours = f'[ -L {b} ] || [ ! -d {b} ] || [ "$(stat -c %u:%a {b})" != "$(id -u):700" ]'
    return f"""umask 077
install -d -m 700 {b} 2>/dev/null
if {ours}; then echo {refuse}; exit 97; fi
find {b} -mindepth 1 -maxdepth 1 -type d -mmin +{STALE_MINUTES} -exec rm -rf -- {{}} + 2>/dev/null
"""


def private_workdir(base: str = RUN_DIR) -> str:
    """Shell lines that make a fresh directory under ``base``, cd into it, point TMPDIR at it,
    and remove it when the script ends, however it ends. Every python is also started with
    ``-I`` (no working or script directory on sys.path, no PYTHON* variables, no user site)."""
    b = shlex.quote(base)
    failed = shlex.quote(f"{REFUSED}mktemp failed in {base}")
    return (
        _checked_base(base)
        + f"""work=$(mktemp -d {b}/preflight.XXXXXXXX) || {{ echo {failed}; exit 97; }}
trap 'cd / && rm -rf -- "$work"' EXIT
trap 'exit 143' HUP INT TERM
cd "$work" && export TMPDIR="$work" || exit 97
"""
    )


def listener_workdir(token: str, base: str = RUN_DIR) -> str:
    """Like ``private_workdir``, for processes that outlive the script: the directory is named
    by the run's token (never by what a node printed) and removed when they are ended."""
    work = shlex.quote(f"{base}/{token}")
    exists = shlex.quote(f"{REFUSED}{base}/{token} exists")
    return (
        _checked_base(base)
        + f"""mkdir -m 700 {work} || {{ echo {exists}; exit 97; }}
cd {work} && export TMPDIR={work} || exit 97
"""
    )


def run_everywhere(
    state: State,
    commands: dict[str, StringCommand],
    seconds: float,
    windows: dict[str, tuple[float, float]] | None = None,
    stdin: str | None = None,
) -> dict[str, list[str]]:
    """Run one command per node, all at once; {node: stdout lines} (nodes that failed: []).
    ``windows`` gets each node's (sent, answered) controller wall-clock times; ``stdin``, one
    line every command reads on its standard input (a secret: never in a command line, which
    every user of the node may read, nor in pyinfra's log)."""
    hosts = {h.data.trainfleet_node: h for h in state.inventory.get_active_hosts()}

    def one(name: str) -> tuple[str, list[str]]:
        sent = time.time()
        try:
            host = hosts[
                name
            ]  # a sudo login (ssh.become) runs the stage as root, as the deploy does
            status, output = host.run_shell_command(
                commands[name],
                _timeout=seconds + 10,
                _sudo=bool(host.data.get("_sudo")),
                _preserve_sudo_env=bool(host.data.get("_preserve_sudo_env")),
                **({"_stdin": stdin} if stdin is not None else {}),
            )
        except Exception:  # timeout or lost connection: the stage's verdict names the node
            return name, []
        if windows is not None:
            windows[name] = (sent, time.time())
        return name, output.stdout_lines

    return dict(fan_out(one, [n for n in commands if n in hosts]))


def shell_stage(script: str, *args: Any, bound: int | None = None) -> StringCommand:
    prefix = ["timeout", "-k", "2", str(bound)] if bound else []
    return shell(script, *args, prefix=prefix)


def python_stage(script: str, *args: Any, bound: int | None = None) -> StringCommand:
    """A stage script that runs python: in a private working directory, removed at the end."""
    return shell_stage(private_workdir(RUN_DIR) + script, *args, bound=bound)


def refusals(stage: str, out: dict[str, list[str]]) -> list[Problem]:
    """A node whose private working directory could not be made safely ran nothing: named."""
    return [
        Problem(stage, node, line[len("trainfleet: ") :])
        for node, lines in sorted(out.items())
        for line in dict.fromkeys(lines)
        if line.startswith(REFUSED)
    ]
