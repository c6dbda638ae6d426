"""``colossalai run`` with its remote hosts reached by OpenSSH, never by fabric (written by
trainfleet into the launcher directory; colossalai.sh runs it with the venv's python).

ColossalAI's runner opens one ``fabric.Connection`` per host. fabric 3.2.3 tells paramiko
to add any unknown host key and loads no known_hosts file, so it logs in to whatever answers at a
node's address, and paramiko cannot read the cluster CA's ``@cert-authority`` line anyway.
Here each host is reached with the system's ``ssh`` in batch mode with strict host key
checking: host keys are verified as every other mesh login verifies them (the cluster CA,
the KRL, known hosts), and a host presenting a key ssh does not trust is refused.
"""

from __future__ import annotations

import multiprocessing
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace


class OpenSshConnection:
    """What ColossalAI's runner uses of ``fabric.Connection``: ``cd``, ``prefix``, ``run``,
    ``local`` and ``close``; a command that fails raises, as fabric's does."""

    def __init__(self, host: str, port: int | None = None) -> None:
        self.host, self.port = host, port
        self.cwd: str | None = None
        self.prefixes: list[str] = []

    @contextmanager
    def cd(self, path: str) -> Iterator[None]:
        before, self.cwd = self.cwd, path
        try:
            yield
        finally:
            self.cwd = before

    @contextmanager
    def prefix(self, command: str) -> Iterator[None]:
        self.prefixes.append(command)
        try:
            yield
        finally:
            self.prefixes.pop()

    def command(self, command: str) -> str:
        cd = [f"cd {shlex.quote(self.cwd)}"] if self.cwd else []
        return " && ".join([*cd, *self.prefixes, command])

    def ssh_argv(self, command: str) -> list[str]:
        port = ["-p", str(self.port)] if self.port else []
        return [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            *port,
            "--",
            self.host,
            self.command(command),
        ]

    def run(self, command: str, hide: bool = False) -> None:
        _check(subprocess.run(self.ssh_argv(command)).returncode, f"{self.host}: ssh")

    def local(self, command: str, hide: bool = False) -> None:
        _check(subprocess.run(["sh", "-c", self.command(command)]).returncode, "local")

    def close(self) -> None:
        pass


def _check(status: int, where: str) -> None:
    if status:
        raise RuntimeError(f"{where} exited {status}")


def main() -> int:
    # The runner's per-host processes must inherit the replaced connection: fork them.
    multiprocessing.set_start_method("fork", force=True)
    from colossalai.cli import cli
    from colossalai.cli.launcher import multinode_runner

    multinode_runner.fabric = SimpleNamespace(Connection=OpenSshConnection)
    status: int = cli(prog_name="colossalai")
    return status


if __name__ == "__main__":
    sys.exit(main())
