"""The one fan-out: a function run on many hosts (or nodes) at once, in gevent greenlets.

pyinfra's own pool belongs to the deploy code that is running (spawning into it from there
deadlocks), so each fan-out gets a pool of its own, sized to its work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import gevent.pool

Item = TypeVar("Item")
Result = TypeVar("Result")


def fan_out(
    work: Callable[[Item], Result], items: Sequence[Item], bound: int | None = None
) -> list[Result]:
    """``work`` on every item at once (at most ``bound`` at a time when given, e.g. pyinfra's
    ``state.config.PARALLEL``); the results in the items' order."""
    size = max(1, min(len(items), bound or len(items)))
    return list(gevent.pool.Pool(size).map(work, items))
