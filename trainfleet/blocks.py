"""Managed blocks: the lines trainfleet owns inside a file that is otherwise the user's.

A block is delimited by exact marker lines. Everything outside the markers is
never rewritten. This module is the one place that splits a file into
(before, block, after); the remote replacement lives in operations/remote.py.
"""

from __future__ import annotations

from dataclasses import dataclass


def markers(purpose: str) -> tuple[str, str]:
    """The begin and end lines of the block that holds ``purpose``, e.g. 'cluster hosts'."""
    return (f"# BEGIN trainfleet managed block: {purpose} (do not edit)",
            f"# END trainfleet managed block: {purpose}")


class BrokenBlock(ValueError):
    """A begin marker without its end (or the reverse): replacing it could eat user lines."""


@dataclass(frozen=True)
class Split:
    before: list[str]
    block: list[str] | None  # None: the file has no block yet
    after: list[str]

    @property
    def outside(self) -> list[tuple[int, str]]:
        """(1-based line number, line) of every line the user owns."""
        offset = len(self.before) + (len(self.block) + 2 if self.block is not None else 0)
        return ([(i + 1, line) for i, line in enumerate(self.before)]
                + [(offset + i + 1, line) for i, line in enumerate(self.after)])


def split_block(lines: list[str], begin: str, end: str) -> Split:
    """Split file lines around the first managed block; raise BrokenBlock when unbalanced."""
    starts = [i for i, line in enumerate(lines) if line == begin]
    ends = [i for i, line in enumerate(lines) if line == end]
    if not starts and not ends:
        return Split(before=list(lines), block=None, after=[])
    if not starts or not ends or ends[0] < starts[0]:
        raise BrokenBlock(f"unbalanced markers ({len(starts)} begin, {len(ends)} end)")
    start, stop = starts[0], ends[0]
    return Split(before=lines[:start], block=lines[start + 1:stop], after=lines[stop + 1:])
