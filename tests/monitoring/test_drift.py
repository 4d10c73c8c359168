"""Feature PSI on quantile bins of the training split."""

from __future__ import annotations

import math

import numpy as np

from pipeline.monitoring.drift import (
    categorical_psi,
    feature_psi,
    numeric_psi,
    quantile_edges,
    stuck_features,
)


def test_the_same_distribution_is_stable_and_a_shift_is_not():
    rng = np.random.default_rng(0)
    reference = rng.lognormal(3.0, 1.0, 20_000)
    assert numeric_psi(reference, rng.lognormal(3.0, 1.0, 5_000)) < 0.02
    moved = numeric_psi(reference, rng.lognormal(3.5, 1.0, 5_000))
    assert 0.1 < moved < numeric_psi(reference, rng.lognormal(4.5, 1.0, 5_000))


def test_a_feature_stuck_at_a_constant_in_serving_is_a_large_shift():
    reference = np.random.default_rng(1).normal(0.0, 1.0, 10_000)
    assert numeric_psi(reference, np.full(2_000, 0.3)) > 2.0


def test_a_mass_at_one_value_gets_its_own_bin():
    reference = np.r_[np.zeros(8_000), np.random.default_rng(2).exponential(1.0, 2_000)]
    edges = quantile_edges(reference, 10)
    assert edges[0] == 0.0 and len(edges) < 9  # the repeated 0-quantiles merged into one edge
    assert numeric_psi(reference, reference[::3]) < 0.01


def test_non_finite_values_have_their_own_bin_and_empty_input_is_undefined():
    reference = np.r_[np.random.default_rng(3).normal(size=1000), [np.nan] * 10]
    assert numeric_psi(reference, np.r_[reference[:900], [np.nan] * 100]) > 0.1
    assert math.isnan(numeric_psi([], [1.0])) and math.isnan(numeric_psi([1.0], []))


def test_categorical_codes_compare_shares_per_code():
    reference = np.repeat([1, 2, 3], [600, 300, 100])
    assert categorical_psi(reference, np.repeat([1, 2, 3], [60, 30, 10])) < 1e-9
    assert categorical_psi(reference, np.repeat([1, 2, 3, 9], [30, 30, 10, 30])) > 0.5  # a new code appears


def test_feature_psi_takes_the_features_both_sides_have():
    rng = np.random.default_rng(4)
    out = feature_psi({"amount": rng.normal(size=500), "mcc_code": rng.integers(1, 5, 500), "gone": np.ones(5)},
                      {"amount": rng.normal(size=200), "mcc_code": rng.integers(1, 5, 200).astype(float), "new": [1.0]},
                      categorical={"mcc_code"})
    assert set(out) == {"amount", "mcc_code"} and all(v < 0.2 for v in out.values())


def test_features_constant_within_a_day_are_not_compared_on_one_day():
    rng = np.random.default_rng(4)
    training = {"weekday": rng.integers(0, 7, 5000).astype(float), "is_weekend": rng.integers(0, 2, 5000).astype(float),
                "hour": rng.integers(0, 24, 5000).astype(float)}
    one_day = {"weekday": np.full(800, 2.0), "is_weekend": np.zeros(800), "hour": rng.integers(0, 24, 800).astype(float)}
    psi = feature_psi(training, one_day, set())
    assert set(psi) == {"hour"} and psi["hour"] < 0.1  # a Wednesday's weekday alone would score ~2


def test_a_feature_stuck_at_one_value_is_found_and_a_drifting_or_naturally_constant_one_is_not():
    rng = np.random.default_rng(5)
    training = {"amount": rng.gamma(2.0, 30.0, 5000), "merchant_tx_count_30d": rng.poisson(50, 5000).astype(float),
                "card_country_tx_count_30d": np.r_[np.zeros(4700), np.ones(300)],  # 94% one value in training too
                "weekday": rng.integers(0, 7, 5000).astype(float)}
    day = {"amount": np.full(1000, 44.71),  # stuck at the training median
           "merchant_tx_count_30d": rng.poisson(400, 1000).astype(float),  # a far drift, not a break
           "card_country_tx_count_30d": np.zeros(1000), "weekday": np.full(1000, 3.0)}  # one value by nature
    assert stuck_features(training, day, 0.99) == ("amount",)
    assert stuck_features(training, day, 0.0) == ()  # off
    assert stuck_features(training, {k: v[:150] for k, v in day.items()}, 0.99) == ()  # too few rows to say
