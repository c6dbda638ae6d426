"""pyinfra's own CLI in this process, with remote-command accounting.

``python -m bench.lab_driver TALLY.json [--cprofile] -- -y --json INVENTORY deploy/x.py``
behaves exactly like ``pyinfra -y --json INVENTORY deploy/x.py`` and also writes TALLY.json:

- ``execs``: SSH ``exec`` requests per node address, counted where paramiko sends them
  (``Channel.exec_command``): one per remote process sshd starts for the controller, whatever
  code path asked for it (facts, operations, trainfleet's own gathering);
- ``sftp``: SFTP sessions and uploads per address (an upload is no exec, but is a round trip);
- ``commands``: per label (``fact <name>`` or ``op <name>``) the count and the summed seconds
  of the remote commands pyinfra ran (summed over nodes, which run concurrently);
- ``stages``: when pyinfra entered each stage (connect, prepare, execute, disconnect), in
  seconds since the driver started, and ``end``; ``connect``: seconds per node;
- ``cprofile`` (with ``--cprofile``): the controller functions with the most own time.

The timed runs of the benchmark do not use this driver; it is for counts and profiles.
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

START = time.monotonic()


class Tally:
    """Everything counted during one run; ``dump`` is the TALLY.json format."""

    def __init__(self) -> None:
        self.execs: Counter[str] = Counter()
        self.sftp_sessions: Counter[str] = Counter()
        self.uploads: Counter[str] = Counter()
        self.command_count: Counter[str] = Counter()
        self.command_seconds: defaultdict[str, float] = defaultdict(float)
        self.stages: list[tuple[str, float]] = []
        self.connect: dict[str, float] = {}
        self.names: dict[str, str] = {}  # address -> inventory name
        self.cprofile: list[dict[str, Any]] = []

    def dump(self, exit_code: int) -> dict[str, Any]:
        return {
            "exit_code": exit_code,
            "execs": dict(self.execs),
            "sftp": {"sessions": dict(self.sftp_sessions), "uploads": dict(self.uploads)},
            "commands": {
                label: {"count": n, "seconds": round(self.command_seconds[label], 4)}
                for label, n in self.command_count.most_common()
            },
            "stages": [{"stage": s, "at": round(t, 4)} for s, t in self.stages],
            "end": round(time.monotonic() - START, 4),
            "connect": {k: round(v, 4) for k, v in self.connect.items()},
            "names": self.names,
            "cprofile": self.cprofile,
        }


TALLY = Tally()
_labels: dict[Any, str] = {}  # greenlet -> the fact it is gathering


def _peer(channel: Any) -> str:
    try:
        return str(channel.get_transport().getpeername()[0])
    except (
        OSError,
        AttributeError,
    ):  # a closed transport: still counted, under a name that says so
        return "unknown"


def _install() -> None:
    """Wrap the few functions every remote command passes through."""
    import gevent
    import paramiko
    from pyinfra.api import facts, state
    from pyinfra.connectors.ssh import SSHConnector

    def wrap(
        owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]
    ) -> None:
        setattr(owner, name, make(getattr(owner, name)))

    def exec_command(original):
        def counted(channel, command):
            TALLY.execs[_peer(channel)] += 1
            return original(channel, command)

        return counted

    def invoke_subsystem(original):
        def counted(channel, subsystem):
            if subsystem == "sftp":
                TALLY.sftp_sessions[_peer(channel)] += 1
            return original(channel, subsystem)

        return counted

    def putfo(original):
        def counted(client, *args, **kwargs):
            TALLY.uploads[_peer(client.get_channel())] += 1
            return original(client, *args, **kwargs)

        return counted

    def get_fact(original):
        # Facts gathered inside an operation's command generator are the fact's, not the op's.
        def labelled(state_, host, cls, *args, **kwargs):
            me = gevent.getcurrent()
            previous = _labels.get(me)
            _labels[me] = f"fact {getattr(cls, 'name', None) or cls.__name__}"
            try:
                return original(state_, host, cls, *args, **kwargs)
            finally:
                if previous is None:
                    _labels.pop(me, None)
                else:
                    _labels[me] = previous

        return labelled

    def run_shell_command(original):
        def timed(connector, command, *args, **kwargs):
            label = _labels.get(gevent.getcurrent()) or _op_label(connector)
            started = time.monotonic()
            try:
                return original(connector, command, *args, **kwargs)
            finally:
                TALLY.command_count[label] += 1
                TALLY.command_seconds[label] += time.monotonic() - started

        return timed

    def connect(original):
        def timed(connector, *args, **kwargs):
            started = time.monotonic()
            try:
                return original(connector, *args, **kwargs)
            finally:
                address = str(connector.data.get("ssh_hostname") or connector.host.name)
                TALLY.connect[connector.host.name] = time.monotonic() - started
                TALLY.names[address] = connector.host.name

        return timed

    def set_stage(original):
        def stamped(state_, stage):
            TALLY.stages.append(
                (getattr(stage, "name", str(stage)).lower(), time.monotonic() - START)
            )
            return original(state_, stage)

        return stamped

    wrap(paramiko.Channel, "exec_command", exec_command)
    wrap(paramiko.Channel, "invoke_subsystem", invoke_subsystem)
    wrap(paramiko.SFTPClient, "putfo", putfo)
    wrap(facts, "_get_fact", get_fact)  # get_fact looks _get_fact up in the module each call
    wrap(SSHConnector, "run_shell_command", run_shell_command)
    wrap(SSHConnector, "connect", connect)
    wrap(state.State, "set_stage", set_stage)


def _op_label(connector: Any) -> str:
    host = connector.host
    op_hash = host.nested_executing_op_hash or host.executing_op_hash
    if op_hash is None:
        return "other"
    names = sorted(connector.state.get_op_meta(op_hash).names)
    return "op " + (names[0] if names else op_hash)


def _top_functions(profile: cProfile.Profile, limit: int = 15) -> list[dict[str, Any]]:
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (filename, line, func), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{_short(filename)}:{line}({func})",
                "calls": calls,
                "own_seconds": round(own, 4),
                "cumulative_seconds": round(cumulative, 4),
            }
        )
    return sorted(rows, key=lambda r: r["own_seconds"], reverse=True)[:limit]


def _short(filename: str) -> str:
    marker = "site-packages/"
    return filename.split(marker, 1)[1] if marker in filename else filename.rsplit("/", 2)[-1]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or "--" not in argv:
        print(
            "usage: python -m bench.lab_driver TALLY.json [--cprofile] -- PYINFRA-ARGS...",
            file=sys.stderr,
        )
        return 2
    split = argv.index("--")
    tally_path, options, pyinfra_args = Path(argv[0]), argv[1:split], argv[split + 1 :]
    _install()
    from pyinfra_cli.main import main as pyinfra_main

    sys.argv = ["pyinfra", *pyinfra_args]
    profile = cProfile.Profile() if "--cprofile" in options else None
    code: int = 1
    try:
        if profile:
            profile.enable()
        pyinfra_main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if profile:
            profile.disable()
            TALLY.cprofile = _top_functions(profile)
        tally_path.write_text(json.dumps(TALLY.dump(code), indent=1) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
