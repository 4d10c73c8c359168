"""The rate ring: per-second counts summed over sliding windows; old seconds leave them, on a hand-moved clock."""

from __future__ import annotations

import threading

import pytest

from pipeline.serving.rates import DecisionRates, WindowCounts
from tests.serving.conftest import FakeClock


def test_a_window_sums_its_seconds_and_old_seconds_expire():
    clock = FakeClock(1000.0)
    rates = DecisionRates(60, clock)
    rates.record(100, 10, 1)
    clock.advance(0.5)
    rates.record(100, 0, 0)  # the same second
    clock.advance(9.5)  # t = 1010
    rates.record(50, 5, 5)
    assert rates.windows((5, 60)) == {5: WindowCounts(5, 50, 5, 5), 60: WindowCounts(60, 250, 15, 6)}
    assert rates.window(11).scored == 250  # 1000 .. 1010
    assert rates.window(10).scored == 50  # 1001 .. 1010: second 1000 has left it
    clock.advance(50)  # t = 1060: second 1000 has left the 60 s window, 1010 has not
    assert rates.window(60) == WindowCounts(60, 50, 5, 5)
    clock.advance(10)
    assert rates.window(60) == WindowCounts(60, 0, 0, 0)
    assert (rates.window(60).review_rate, rates.window(60).block_rate) == (None, None)


def test_a_slot_reused_after_the_ring_wraps_forgets_its_old_second():
    clock = FakeClock(1000.0)
    rates = DecisionRates(10, clock)
    rates.record(7, 7, 7)
    clock.advance(10)  # same slot, ten seconds later
    rates.record(1, 0, 0)
    assert rates.window(10) == WindowCounts(10, 1, 0, 0)
    clock.advance(25)  # a record-free stretch longer than the ring
    assert rates.window(10).scored == 0


def test_rates_are_shares_of_the_scored_payments():
    counts = WindowCounts(300, scored=2000, flagged=10, blocked=1)
    assert (counts.review_rate, counts.block_rate) == (0.005, 0.0005)


def test_a_window_longer_than_the_ring_is_refused():
    with pytest.raises(ValueError, match="outside 1..60"):
        DecisionRates(60).windows((30, 61))


def test_concurrent_records_are_all_counted():
    rates = DecisionRates(60, FakeClock())
    threads = [threading.Thread(target=lambda: [rates.record(3, 2, 1) for _ in range(5000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert rates.window(60) == WindowCounts(60, 60_000, 40_000, 20_000)
