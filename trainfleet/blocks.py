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
    return (
        f"# BEGIN trainfleet managed block: {purpose} (do not edit)",
        f"# END trainfleet managed block: {purpose}",
    )


class BrokenBlock(ValueError):
    """The file is not "user lines, one block or none, user lines": rewriting it could lose
    lines."""


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
        return [(i + 1, line) for i, line in enumerate(before)] + [
            (offset + i + 1, line) for i, line in enumerate(_lines(self.after))
        ]


def _lines(text: str) -> list[str]:
    """Lines split on "\\n" only: a carriage return or U+2028 is part of its line, as for sh and
    awk."""
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def split_block(text: str, purpose: str) -> Split:
    """Split a file's whole text around the block for ``purpose``; raise BrokenBlock if
    ambiguous."""
    begin, end = markers(purpose)
    lookalike = re.compile(
        rf"(BEGIN|END) trainfleet managed block: {re.escape(purpose)}(?=$|[\s(])"
    )
    # Only lines that hold the purpose's marker text can be markers or look like one: they
    # are found with str.find (a file of N lines is not walked line by line in Python) and
    # each is then judged whole. Lines are split on "\n" only.
    needle = f"trainfleet managed block: {purpose}"
    starts: list[int] = []
    ends: list[int] = []
    offsets: list[tuple[int, int]] = []  # (start, end) of each marker line in the text
    at = text.find(needle)
    while at != -1:
        line_start = text.rfind("\n", 0, at) + 1
        line_end = text.find("\n", at)
        line_end = len(text) if line_end == -1 else line_end
        line = text[line_start:line_end]
        if line in (begin, end) or lookalike.search(line):
            number = text.count("\n", 0, line_start) + 1
            if line == begin:
                starts.append(number)
            elif line == end:
                ends.append(number)
            else:
                raise BrokenBlock(
                    f"line {number} looks like a trainfleet marker but is not exactly one: {line!r}"
                )
            offsets.append((line_start, line_end))
        at = text.find(needle, line_end)
    if not starts and not ends:
        return Split(before="", block=None, after=text)
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        where = ", ".join(
            [f"BEGIN at line {n}" for n in starts] + [f"END at line {n}" for n in ends]
        )
        raise BrokenBlock(f"expected one BEGIN followed by one END marker, found {where}")
    (begin_at, begin_stop), (end_at, end_stop) = offsets
    inside = text[begin_stop + 1 : end_at]  # the lines between the markers, each ending in "\n"
    block = inside[:-1].split("\n") if inside else []
    # After the END marker: the rest of the file byte for byte (no final newline: nothing)
    return Split(before=text[:begin_at], block=block, after=text[end_stop + 1 :])


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
