"""The managed block of any file, and the one parser other facts use for theirs."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from trainfleet.blocks import BrokenBlock, markers, split_block

MISSING = "--trainfleet-missing--"
SECTION = "--trainfleet-section--"


def split_sections(output: list[str], marker: str = SECTION) -> tuple[list[str], dict[str, list[str] | None]]:
    """The one parser of sectioned fact output: (lines before the first ``marker NAME`` line,
    {NAME: its lines, or None where the section is just MISSING (no such file)})."""
    head: list[str] = []
    sections: dict[str, list[str] | None] = {}
    current = head
    for line in output:
        if line.startswith(marker + " "):
            current = sections.setdefault(line.split(" ", 1)[1], [])
        else:
            current.append(line)
    return head, {name: None if lines == [MISSING] else lines for name, lines in sections.items()}


class BlockState(TypedDict):
    exists: bool
    block: list[str] | None  # None: the file has no block yet
    outside: list[tuple[int, str]]  # (line number, line) the user owns
    broken: str | None  # why the markers cannot be trusted


def block_state(lines: list[str] | None, purpose: str) -> BlockState:
    """Split a file's lines (None: no such file) around the block that holds ``purpose``."""
    if lines is None:
        return {"exists": False, "block": None, "outside": [], "broken": None}
    begin, end = markers(purpose)
    try:
        split = split_block(lines, begin, end)
    except BrokenBlock as exc:
        return {"exists": True, "block": None, "outside": list(enumerate(lines, 1)), "broken": str(exc)}
    return {"exists": True, "block": split.block, "outside": split.outside, "broken": None}


def cat_or_missing(path: str) -> StringCommand:
    """Print a file, or a marker line when it does not exist (an empty file prints nothing)."""
    return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "echo", MISSING)


class ManagedBlock(FactBase[BlockState]):
    """
    A file split around trainfleet's block for ``purpose``.

    + path: the file
    + purpose: what the block holds, as in its markers, e.g. ``cluster hosts``

    .. code:: python

        {
            "exists": True,
            "block": ["192.0.2.11      gpu-a01.cluster.example.com gpu-a01"],
            "outside": [(1, "127.0.0.1 localhost")],
            "broken": None,
        }
    """

    def command(self, path: str, purpose: str) -> StringCommand:
        self.purpose = purpose
        return cat_or_missing(path)

    def process(self, output: list[str]) -> BlockState:
        return block_state(None if output == [MISSING] else output, self.purpose)

    @staticmethod
    def default() -> BlockState:
        # pyinfra calls this instead of process() when the command printed nothing:
        # the file exists and is empty.
        return {"exists": True, "block": None, "outside": [], "broken": None}
