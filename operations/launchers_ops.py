"""Launcher configs: every launcher's files on every node, derived from the one spec."""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.launchers_facts import LauncherFiles
from operations.remote import fail_command, write_file_command
from runtime.gather import fact
from trainfleet.defaults import LAUNCH_DIR


@operation()
def launcher_files(
    files: dict[str, tuple[str, str]],
    problems: list[str] | None = None,
    directory: str = LAUNCH_DIR,
):
    """
    Keep the launcher directory's files exactly as rendered; other files there are left alone.

    + files: file name -> (content, mode), e.g. the plan's ``launchers.files``
    + problems: why the files cannot be right (the node's NCCL environment); the node fails
      with them and no file is written
    + directory: where the files live

    **Example:**

    .. code:: python

        launchers.launcher_files(name="Launcher configs", files=render_launchers(cluster, node))
    """
    if problems:
        yield fail_command("launcher files not written: " + "; ".join(problems))
        return
    current = fact(LauncherFiles, directory=directory)
    commands = []
    for name, (content, mode) in sorted(files.items()):
        path = f"{directory}/{name}"
        have = current.get(name)
        if have is None or have["sha256"] != hashlib.sha256(content.encode()).hexdigest():
            commands.append(write_file_command(path, content, mode=mode))
            if have is not None and have["mode"] != mode:
                commands.append(StringCommand("chmod", mode, QuoteString(path)))
        elif have["mode"] != mode:
            commands.append(StringCommand("chmod", mode, QuoteString(path)))
    if not commands:
        host.noop(f"{len(files)} launcher files in {directory} are up to date")
        return
    yield from commands
