"""Facts of the launcher directory: what each file in it holds (by hash) and its mode."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

_SCRIPT = r"""
[ -d "$1" ] || exit 0
for f in "$1"/* "$1"/.[!.]*; do
  [ -f "$f" ] && printf '%s %s %s\n' "$(stat -c %a "$f")" "$(sha256sum < "$f" | cut -d' ' -f1)" "${f##*/}"
done
true
"""


class FileSum(TypedDict):
    mode: str
    sha256: str


class LauncherFiles(FactBase[dict[str, FileSum]]):
    """
    Every regular file in the launcher directory: ``{name: {"mode": ..., "sha256": ...}}``.

    + directory: the launcher directory

    .. code:: python

        {"hostfile": {"mode": "644", "sha256": "3f2a..."}, "torchrun.sh": {"mode": "755", "sha256": "..."}}
    """

    def command(self, directory: str) -> StringCommand:
        return StringCommand("sh", "-c", QuoteString(_SCRIPT), "trainfleet", QuoteString(directory))

    def process(self, output: list[str]) -> dict[str, FileSum]:
        files: dict[str, FileSum] = {}
        for line in output:
            mode, sha, name = line.split(" ", 2)
            files[name] = {"mode": mode, "sha256": sha}
        return files

    @staticmethod
    def default() -> dict[str, FileSum]:
        return {}
