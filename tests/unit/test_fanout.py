"""The one fan-out: results in order, all at once or at most ``bound`` at a time."""

from __future__ import annotations

import gevent

from runtime.fanout import fan_out


def _running(bound: int | None, items: int) -> tuple[list[int], int]:
    now = peak = 0

    def work(item: int) -> int:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        gevent.sleep(0.01)
        now -= 1
        return item * 2

    return fan_out(work, list(range(items)), bound), peak


def test_fan_out_keeps_the_items_order_and_runs_them_all_at_once_without_a_bound():
    assert _running(None, 8) == ([i * 2 for i in range(8)], 8)


def test_fan_out_runs_at_most_bound_at_a_time():
    assert _running(3, 8) == ([i * 2 for i in range(8)], 3)
    assert _running(0, 4)[1] == 4  # pyinfra's PARALLEL unset (0): no bound


def test_fan_out_over_nothing_is_empty():
    assert fan_out(lambda item: item, []) == []
