"""Facts of the launcher directory: what each file in it holds (by hash) and its mode, and
the text of the few files drift found changed."""

from __future__ import annotations

from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.managed_block_facts import file_text, read_file_lines
from facts.shell import script, shell

_SCRIPT = script("launchers.sh")


class FileSum(TypedDict):
    mode: str
    sha256: str


class LauncherFiles(FactBase[dict[str, FileSum]]):
    """
    Every regular file in the launcher directory and its ``healthy/`` folder:
    ``{name: {"mode": ..., "sha256": ...}}`` (``healthy/hostfile`` for the folder's).

    + directory: the launcher directory

    .. code:: python

        {"hostfile": {"mode": "644", "sha256": "3f2a..."},
         "torchrun.sh": {"mode": "755", "sha256": "..."}}
    """

    def command(self, directory: str) -> StringCommand:
        return shell(_SCRIPT, directory)

    def process(self, output: list[str]) -> dict[str, FileSum]:
        files: dict[str, FileSum] = {}
        for line in output:
            mode, sha, name = line.split(" ", 2)
            files[name] = {"mode": mode, "sha256": sha}
        return files

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What a node answers once ``value``'s files are in the directory ``recorded`` lists:
        theirs in the recorded order, others the node holds kept, new ones last by name (the
        controller benchmark's converged node)."""
        files = dict(value)
        out = []
        for line in recorded:
            name = line.split(" ", 2)[2]
            if name in files:
                mine = files.pop(name)
                line = f"{mine['mode']} {mine['sha256']} {name}"
            out.append(line)
        return out + [f"{f['mode']} {f['sha256']} {name}" for name, f in sorted(files.items())]

    @staticmethod
    def default() -> dict[str, FileSum]:
        return {}


CONTENT_BYTES = 65536  # of one launcher file drift shows a diff of: its diff is 40 lines anyway

# Each named file as one framed ``file NAME STATE - BASE64`` line (facts/managed_block_facts.py),
# bounded: a file a user grew to gigabytes costs its first CONTENT_BYTES only.
_CONTENT_SCRIPT = script("launchers_content.sh")


class LauncherContents(FactBase[dict[str, str | None]]):
    """
    The text of the named launcher files (their first CONTENT_BYTES): ``{name: text}``,
    None for a file that is missing or not a regular file. Drift reads it only from a node
    whose launcher files differ from its plan, and only those files: a converged node sends
    digests alone (LauncherFiles).

    + directory: the launcher directory
    + names: file names in it (trainfleet's own: ``hostfile``, ``healthy/hostfile``)
    """

    def command(self, directory: str, names: list[str]) -> StringCommand:
        return shell(_CONTENT_SCRIPT, directory, CONTENT_BYTES, *names)

    def process(self, output: list[str]) -> dict[str, str | None]:
        return {name: file_text(read) for name, read in read_file_lines(output).items()}

    @staticmethod
    def default() -> dict[str, str | None]:
        return {}
