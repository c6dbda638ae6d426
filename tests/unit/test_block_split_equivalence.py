"""split_block finds markers in one pass over the text; it must read every file exactly as
the line-by-line reader it replaced (kept here as the oracle), broken files included."""

from __future__ import annotations

import random
import re

import pytest

from trainfleet.blocks import BrokenBlock, Split, markers, split_block

PURPOSE = "cluster hosts"


def line_by_line(text: str, purpose: str) -> Split:
    begin, end = markers(purpose)
    lookalike = re.compile(
        rf"(BEGIN|END) trainfleet managed block: {re.escape(purpose)}(?=$|[\s(])"
    )
    starts, ends = [], []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if line == begin:
            starts.append(number)
        elif line == end:
            ends.append(number)
        elif lookalike.search(line):
            raise BrokenBlock(
                f"line {number} looks like a trainfleet marker but is not exactly one: {line!r}"
            )
    if not starts and not ends:
        return Split(before="", block=None, after=text)
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        where = ", ".join(
            [f"BEGIN at line {n}" for n in starts] + [f"END at line {n}" for n in ends]
        )
        raise BrokenBlock(f"expected one BEGIN followed by one END marker, found {where}")
    start, stop = starts[0] - 1, ends[0] - 1
    after = "" if stop == len(lines) - 1 else "\n".join(lines[stop + 1 :])
    return Split(
        before="".join(line + "\n" for line in lines[:start]),
        block=lines[start + 1 : stop],
        after=after,
    )


def read(reader, text: str):
    try:
        return reader(text, PURPOSE)
    except BrokenBlock as exc:
        return str(exc)


BEGIN, END = markers(PURPOSE)
PIECES = [
    BEGIN,
    END,
    "127.0.0.1 localhost",
    "",
    "198.18.0.11 node1",
    f"{BEGIN}\r",
    f" {END}",
    f"# {END} x",
    f"{BEGIN} ",
    f"x{END}",
    "# BEGIN trainfleet managed block: other (do not edit)",
    "\u2028",
    f"{END}(",
    f"{END}\tnote",
    "a\rb",
    f"{BEGIN}{END}",
]


@pytest.mark.parametrize("seed", range(400))
def test_every_file_reads_as_the_line_by_line_reader_read_it(seed):
    rng = random.Random(seed)
    lines = [rng.choice(PIECES) for _ in range(rng.randint(0, 8))]
    if rng.random() < 0.5:  # most files: one well-formed block somewhere
        at = rng.randint(0, len(lines))
        lines[at:at] = [BEGIN, *rng.sample(PIECES[2:5], rng.randint(0, 3)), END]
    text = "\n".join(lines) + ("\n" if rng.random() < 0.7 else "")
    assert read(split_block, text) == read(line_by_line, text), repr(text)
