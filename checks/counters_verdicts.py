"""Error counters under trainfleet's own load: each InfiniBand port's error counters read
before and after the preflight's bandwidth stage; a port whose errors grew while the stage
drove traffic through it is named (symbol errors, link downs and recoveries, receive errors:
a link that flaps or degrades under load passes an idle check). Plain functions."""

from __future__ import annotations

import re

from checks.preflight_report import Problem
from trainfleet.hw.infiniband import ERROR_COUNTERS
from trainfleet.text import printable

_LINE = re.compile(r"ib ([A-Za-z0-9_]{1,32}) ([0-9]{1,3}) ([A-Za-z0-9_]{1,64}) ([0-9]{1,20})")
Counters = dict[tuple[str, str, str], int]  # (HCA, port, counter) -> value


def read_counters(lines: list[str]) -> Counters:
    """``counters.sh``'s lines as numbers (anything else is not a counter line)."""
    found: Counters = {}
    for line in lines:
        if (m := _LINE.fullmatch(line.strip())) and m.group(3) in ERROR_COUNTERS:
            found[(m.group(1), m.group(2), m.group(3))] = int(m.group(4))
    return found


def counter_problems(before: dict[str, Counters], after: dict[str, Counters]) -> list[Problem]:
    """A port whose error counter grew between the two readings, per node. A counter that went
    down was reset (or wrapped) in between: nothing can be said of it."""
    problems = []
    for node, now in after.items():
        grew = [
            f"{printable(hca, 32)} port {port} {name} {before[node][key]} -> {value}"
            for key, value in sorted(now.items())
            if key in before.get(node, {}) and value > before[node][key]
            for hca, port, name in [key]
        ]
        if grew:
            problems.append(
                Problem(
                    "bandwidth",
                    node,
                    "InfiniBand error counters grew under the bandwidth stage's load: "
                    + "; ".join(grew)
                    + ": the link degrades under traffic (reseat or replace the cable or "
                    "transceiver; check the switch port)",
                )
            )
    return problems
