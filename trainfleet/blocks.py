"""Managed blocks: the lines trainfleet owns inside a file that is otherwise the user's.

This module is the one parser of managed blocks. Facts read a file's exact bytes; the
parser accepts only "user lines, one well-formed block (or none), user lines" and raises
``BrokenBlock`` (naming the line) for anything else: a lone or repeated marker, a marker
with a carriage return or other damage, marker text inside a user line. The new content
is built here from the parsed file, and the node replaces the file only if it still has
the bytes the fact read (operations/remote.py), so nothing the parser did not see is lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def markers(purpose: str) -> tuple[str, str]:
    """The begin and end lines of the block that holds ``purpose``, e.g. 'cluster hosts'."""
    return (f"# BEGIN trainfleet managed block: {purpose} (do not edit)",
            f"# END trainfleet managed block: {purpose}")


class BrokenBlock(ValueError):
    """The file is not "user lines, one block or none, user lines": rewriting it could lose lines."""


@dataclass(frozen=True)
class Split:
    """A file's text around its block. ``before`` ends with a newline (or is empty); ``after``
    is the rest of the file byte for byte, with or without a final newline."""

    before: str
    block: list[str] | None  # None: the file has no block yet
    after: str

    @property
    def outside(self) -> list[tuple[int, str]]:
        """(1-based line number, line) of every line the user owns."""
        before = _lines(self.before)
        offset = len(before) + (len(self.block) + 2 if self.block is not None else 0)
        return [(i + 1, line) for i, line in enumerate(before)] + \
               [(offset + i + 1, line) for i, line in enumerate(_lines(self.after))]


def _lines(text: str) -> list[str]:
    """Lines split on "\\n" only: a carriage return or U+2028 is part of its line, as for sh and awk."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def split_block(text: str, purpose: str) -> Split:
    """Split a file's whole text around the block for ``purpose``; raise BrokenBlock if ambiguous."""
    begin, end = markers(purpose)
    # Anything that looks like one of this purpose's markers but is not exactly one.
    lookalike = re.compile(rf"(BEGIN|END) trainfleet managed block: {re.escape(purpose)}(?=$|[\s(])")
    starts: list[int] = []
    ends: list[int] = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if line == begin:
            starts.append(number)
        elif line == end:
            ends.append(number)
        elif lookalike.search(line):
            raise BrokenBlock(f"line {number} looks like a trainfleet marker but is not exactly one: {line!r}")
    if not starts and not ends:
        return Split(before="", block=None, after=text)
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        where = ", ".join([f"BEGIN at line {n}" for n in starts] + [f"END at line {n}" for n in ends])
        raise BrokenBlock(f"expected one BEGIN followed by one END marker, found {where}")
    start, stop = starts[0] - 1, ends[0] - 1
    if stop == len(lines) - 1:  # the END marker is the last line and has no newline
        after = ""
    else:
        after = "\n".join(lines[stop + 1:])
    before = "".join(line + "\n" for line in lines[:start])
    return Split(before=before, block=lines[start + 1:stop], after=after)


def with_block(split: Split, purpose: str, lines: list[str] | None, top: bool = False) -> str:
    """The file's new text: ``lines`` in the block (where it stands; if absent, appended, or
    first with ``top``), or with ``lines=None`` the block removed. User text is kept byte
    for byte; a last user line without a newline gets one before an appended block."""
    if lines is None:
        return split.before + split.after
    begin, end = markers(purpose)
    block = "".join(f"{line}\n" for line in [begin, *lines, end])
    if split.block is not None:
        return split.before + block + split.after
    text = split.after
    if top:
        return block + text
    if text and not text.endswith("\n"):
        text += "\n"
    return text + block
