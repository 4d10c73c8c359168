"""The online-feature benchmark at a tiny size: its fields, and the state it timed."""

from __future__ import annotations

from pipeline.bench.online_features import SMALL_MERCHANT_PAYMENTS, measure


def test_measure_reports_per_payment_percentiles_and_the_big_merchant_ratio():
    result = measure(quick=True, sizes=(2_000, 200, 20, 3_000, 300))
    assert 0 < result["online_feature_us_p50"] <= result["online_feature_us_p99"]
    assert result["online_big_merchant_ratio"] == round(result["big_merchant_us_p99"]
                                                        / result["small_merchant_us_p99"], 3)
    assert result["online_big_merchant_ratio"] > 0
    assert result["big_merchant_payments"] == 3_000 and result["timed_payments"] == 300
    # Every filled and timed payment was remembered: 300 ordinary, 300 at each of the two merchants.
    assert result["state"]["payments"] == 2_000 + 3_000 + SMALL_MERCHANT_PAYMENTS + 3 * 300
    assert result["state"]["merchants"] == 20 + 2
