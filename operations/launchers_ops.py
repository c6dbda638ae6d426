"""Launcher configs: every launcher's files on every node, derived from the one spec."""

from __future__ import annotations

import hashlib

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from facts.launchers_facts import LauncherFiles
from operations.remote import fail_command, write_file_command
from runtime.gather import fact
from trainfleet.capabilities.launchers import HEALTHY, LAUNCH_FILE_NAMES, LaunchersPlan
from trainfleet.defaults import LAUNCH_DIR


@operation()
def launcher_files(launchers: LaunchersPlan, directory: str = LAUNCH_DIR):
    """
    Keep the launcher directory's files exactly as rendered; other files there are left alone,
    but for trainfleet's own in its ``healthy/`` folder that the plan no longer has (the node
    left the healthy subset), which are removed.

    + launchers: the plan's ``launchers`` part: ``files``, file name -> (content, mode);
      ``problems``, why the files cannot be right (the node's NCCL environment): the node
      fails with them and no file is written
    + directory: where the files live

    **Example:**

    .. code:: python

        launchers_ops.launcher_files(name="Launcher configs", launchers=plan.launchers)
    """
    files = launchers.files
    if launchers.problems:
        yield fail_command("launcher files not written: " + "; ".join(launchers.problems))
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
    gone = [
        name
        for name in sorted(current)
        if name.partition("/")[::2] in {(HEALTHY, base) for base in LAUNCH_FILE_NAMES}
        and name not in files
    ]
    if gone:  # root removes nothing through a link: the folder must be a real one
        folder = QuoteString(f"{directory}/{HEALTHY}")
        refused = QuoteString(f"trainfleet: {directory}/{HEALTHY} is a link: nothing removed")
        commands.append(
            StringCommand("{ [ ! -L", folder, "] || { echo", refused, "1>&2; exit 1; }; }")
        )
    for name in gone:
        commands.append(StringCommand("rm", "-f", "--", QuoteString(f"{directory}/{name}")))
    if gone and not any(name.startswith(f"{HEALTHY}/") for name in files):
        # the folder goes too where nothing but trainfleet's files was in it
        folder = QuoteString(f"{directory}/{HEALTHY}")
        commands.append(StringCommand("rmdir", "--ignore-fail-on-non-empty", "--", folder))
    if not commands:
        host.noop(f"{len(files)} launcher files in {directory} are up to date")
        return
    yield from batched(commands)


# Of one command pyinfra sends: sh -c takes it as one argument, which Linux caps at 128 KiB,
# and the sudo wrapper's quoting makes it longer.
BATCH_CHARACTERS = 60_000


def batched(commands: list[StringCommand]) -> list[StringCommand]:
    """The commands joined with ``&&`` into as few as fit BATCH_CHARACTERS each (the first
    that fails stops its batch and fails the operation): a first deploy writes the launcher
    files and the healthy subset's in a few remote commands, not one per file."""
    batches: list[list[StringCommand]] = []
    size = 0
    for command in commands:
        length = len(command.get_raw_value()) + 4
        if not batches or size + length > BATCH_CHARACTERS:
            batches.append([])
            size = 0
        batches[-1].append(command)
        size += length
    return [
        StringCommand(
            *[part for i, c in enumerate(batch) for part in ([c] if not i else ["&&", c])]
        )
        for batch in batches
    ]
