"""WindowedLog: after any sequence of inserts, removals, cursor moves and drops, each aggregate holds
exactly the events in ``[t - w, t)``, checked against a brute-force count on small integer times
(so window bounds, ties and late events coincide often)."""

from __future__ import annotations

import random

import pytest

from pipeline.features.windows import COMPACT_AT, Count, WindowedLog

WINDOWS = (3, 10, 25)


class Sum:
    def __init__(self) -> None:
        self.n = self.total = 0

    def add(self, row: int) -> None:
        self.n += 1
        self.total += row

    def remove(self, row: int) -> None:
        self.n -= 1
        self.total -= row


def _expected(events: list[tuple[int, int]], t: int) -> list[tuple[int, int]]:
    return [(sum(1 for ts, _ in events if t - w <= ts < t), sum(r for ts, r in events if t - w <= ts < t))
            for w in WINDOWS]


@pytest.mark.parametrize("follow", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_aggregates_hold_exactly_the_window_whatever_the_order_of_operations(seed, follow):
    rng = random.Random(seed)
    log = WindowedLog(WINDOWS, lambda i: Sum(), follow=follow)
    held: list[tuple[int, int]] = []
    floor = 0  # nothing before this is asked once dropped
    for _ in range(3000):
        op = rng.random()
        if op < 0.45:
            ts = rng.randint(floor - 30, floor + 60)  # late, at the cursor, ahead
            row = rng.randint(1, 9)
            log.insert(ts, row)
            held.append((ts, row))
        elif op < 0.55 and held:
            ts, row = rng.choice(held)
            assert log.remove(ts, row)
            held.remove((ts, row))
        elif op < 0.97:
            t = rng.randint(floor, floor + 60)
            log.move_to(t)
            assert [(a.n, a.total) for a in log.aggregates] == _expected(held, t), t
            before = [ts for ts, _ in held if ts < t]
            assert log.latest_before_cursor() == (max(before) if before else None)
        else:
            floor += rng.randint(0, 20)
            log.drop_before(floor)
            held = [(ts, r) for ts, r in held if ts >= floor - max(WINDOWS)]
            assert len(log) == len(held)


def test_dropped_events_are_cut_off_once_they_are_half_the_log():
    log = WindowedLog((10,), lambda i: Count(), keep_rows=False)
    for ts in range(4 * COMPACT_AT):
        log.insert(ts)
    assert log.drop_before(COMPACT_AT + 10) == COMPACT_AT and len(log.ts) == 4 * COMPACT_AT  # marked only
    assert log.drop_before(2 * COMPACT_AT + 10) == COMPACT_AT and len(log.ts) == 2 * COMPACT_AT  # cut
    log.move_to(2 * COMPACT_AT + 15)
    assert log.aggregates[0].n == 10 and log.latest_before_cursor() == 2 * COMPACT_AT + 14


def test_removing_an_event_that_is_not_held_changes_nothing():
    log = WindowedLog((10,), lambda i: Sum())
    log.insert(5, 1)
    log.move_to(8)
    assert log.remove(5, 2) is False and log.remove(6, 1) is False
    assert (log.aggregates[0].n, log.aggregates[0].total) == (1, 1)
    assert log.remove(5, 1) is True and log.aggregates[0].n == 0 and len(log) == 0


def test_a_following_log_keeps_up_with_inserts_so_a_query_after_many_pays_for_none():
    log = WindowedLog((10,), lambda i: Count(), keep_rows=False, follow=True)
    for ts in range(100_000):
        log.insert(ts)
    assert log.cursor == 99_999 and log.aggregates[0].n == 10  # kept current by the inserts
    log.move_to(100_000)
    assert log.aggregates[0].n == 10 and log.latest_before_cursor() == 99_999
