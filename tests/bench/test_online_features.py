"""The online-feature benchmark at a tiny size: the inputs of its big-merchant goal (ratio <= 2), the
state it timed, and the one timed operation ingest's replay shares with it."""

from __future__ import annotations

import random

from pipeline.bench.online_features import (
    SMALL_MERCHANT_PAYMENTS,
    START_US,
    _payment,
    measure,
    percentiles,
    time_payment,
)
from pipeline.features.online import OnlineFeatureState
from pipeline.features.params import FeatureParams

FILL, CARDS, MERCHANTS, BIG, TIMED = 2_000, 200, 20, 3_000, 300


def test_the_ratio_compares_a_merchant_with_a_big_window_to_one_with_a_small_one():
    result = measure(quick=True, sizes=(FILL, CARDS, MERCHANTS, BIG, TIMED))
    assert 0 < result["online_feature_us_p50"] <= result["online_feature_us_p99"]
    assert result["big_merchant_timed"] == result["small_merchant_timed"] == TIMED
    # The fill spreads 30 days before the timed payments, which span under 4 hours: the big merchant's
    # window loses under 1 % of its fill and gains at most the timed payments; the small one likewise.
    big_low, big_high = result["big_merchant_window"]
    small_low, small_high = result["small_merchant_window"]
    assert 0.99 * BIG <= big_low <= big_high <= BIG + TIMED
    assert 0.9 * SMALL_MERCHANT_PAYMENTS <= small_low <= small_high <= SMALL_MERCHANT_PAYMENTS + TIMED
    assert big_high - big_low >= TIMED - 1 - 0.01 * BIG  # every timed payment joined the big window
    assert big_low > 5 * small_high  # the goal's two sides really differ in history
    assert result["big_merchant_us_p99"] > 0 and result["small_merchant_us_p99"] > 0
    # Every filled and timed payment was remembered: 300 ordinary, 300 at each of the two merchants.
    assert result["state"]["payments"] == FILL + BIG + SMALL_MERCHANT_PAYMENTS + 3 * TIMED
    assert result["state"]["merchants"] == MERCHANTS + 2


def test_a_timed_payment_is_remembered_as_the_scorer_remembers_it():
    state = OnlineFeatureState(FeatureParams())
    rng = random.Random(0)
    timed = [time_payment(state, _payment(rng, f"t{i}", i, "m", START_US + i)) for i in range(3)]
    assert all(micros > 0 for micros, _ in timed)
    assert [features["merchant_tx_count_30d"] for _, features in timed] == [0, 1, 2]  # earlier payments only
    assert state.size()["payments"] == 3


def test_percentiles_are_numpys_p50_and_p99():
    assert percentiles([float(v) for v in range(1, 101)]) == (50.5, 99.01)
