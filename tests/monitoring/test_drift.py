"""Feature PSI on quantile bins of the training split."""

from __future__ import annotations

import math

import numpy as np

from pipeline.monitoring.drift import (
    broken_inputs,
    categorical_psi,
    collapsed,
    feature_psi,
    numeric_psi,
    out_of_range_features,
    out_of_range_share,
    quantile_edges,
    segment_collapses,
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


def _channels_day(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A day of three channels (codes 4: 25%, 5: 40%, 11: 35%) and three features that vary within each."""
    channel = rng.choice([4.0, 5.0, 11.0], n, p=[0.25, 0.40, 0.35])
    return {"channel_code": channel, "amount": rng.gamma(2.0, 30.0, n),
            "card_tx_count_1h": np.where(rng.random(n) < 0.6, 0.0, rng.integers(1, 5, n)),  # 60% at 0 in training
            "weekday": np.full(n, 2.0)}


def test_a_value_taking_over_part_of_the_traffic_or_a_feature_stuck_at_its_mode_is_a_collapse():
    rng = np.random.default_rng(6)
    training = rng.gamma(2.0, 30.0, 5000)
    served = rng.gamma(2.0, 30.0, 1000)
    part_stuck = np.where(rng.random(1000) < 0.87, 44.71, served)  # 87% of a code, the other 13% another channel
    assert collapsed(training, part_stuck, 0.5) and not collapsed(training, served, 0.5)
    assert not collapsed(training, part_stuck, 0.1)  # 13% of other values kept: more than a tenth
    mostly_zero = np.r_[np.zeros(4700), rng.beta(1, 50, 300)]  # 6% non-zero in training, e.g. a merchant fraud rate
    assert collapsed(mostly_zero, np.zeros(700), 0.5)  # stuck at its mode: expect 42 others, see 0
    assert not collapsed(mostly_zero, np.r_[np.zeros(670), rng.beta(1, 50, 30)], 0.5)  # 30 of 42: more than half kept
    assert not collapsed(mostly_zero, np.r_[np.zeros(195), rng.beta(1, 50, 5)], 0.5)  # 5 of 12: chance does it (3%)
    assert not collapsed(mostly_zero, np.zeros(40), 0.5)  # 2.4 others expected: 0 is no evidence
    assert collapsed(training, np.full(300, np.nan), 0.5) and not collapsed(training, np.empty(0), 0.5)


def test_a_feature_stuck_in_one_channel_is_named_with_that_channel_and_healthy_channels_are_not():
    rng = np.random.default_rng(7)
    training, day = _channels_day(rng, 20_000), _channels_day(rng, 3_000)
    assert segment_collapses(training, day, ("channel_code",), 0.5) == ()  # a healthy day: nothing
    outage = day["channel_code"] == 11.0
    broken = {**day, "amount": np.where(outage, 44.71, day["amount"]),
              "card_tx_count_1h": np.where(outage, 0.0, day["card_tx_count_1h"])}  # stuck at its mode
    assert segment_collapses(training, broken, ("channel_code",), 0.5) == (
        "amount@channel_code=11", "card_tx_count_1h@channel_code=11")
    assert stuck_features(training, broken, 0.99) == ()  # 35% of the day: the whole-day rule cannot see it
    assert segment_collapses(training, broken, ("channel_code",), 0.0) == ()  # off
    assert segment_collapses(training, broken, ("mcc_code",), 0.5) == ()  # no such segment feature


ATM_MCC = 77.0  # the code of ATM withdrawals' merchant category


def _paths_day(rng: np.random.Generator, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """A day whose raw channels card_present (40%, code 5), ecommerce (25%, code 4), contactless (27%)
    and atm (8%) share channel codes as the hash makes them: contactless and atm are both code 11.
    ATM payments are all one merchant category, the others spread over three. Returns the served
    features and each row's raw channel."""
    channel = rng.choice(["card_present", "ecommerce", "contactless", "atm"], n, p=[0.40, 0.25, 0.27, 0.08])
    code = np.select([channel == "card_present", channel == "ecommerce"], [5.0, 4.0], 11.0)
    mcc = np.where(channel == "atm", ATM_MCC, rng.choice([12.0, 31.0, 58.0], n))
    return {"channel_code": code, "mcc_code": mcc, "country_code": rng.choice([3.0, 8.0], n, p=[0.8, 0.2]),
            "amount": rng.gamma(2.0, 30.0, n), "weekday": np.full(n, 2.0)}, channel


def test_an_outage_of_a_channel_that_is_a_minority_of_its_code_is_seen_in_another_segment_feature():
    """atm shares code 11 with the larger contactless: its outage leaves 77% of code 11's amounts
    varied, more than half, so the channel segment cannot show it; ATM's merchant category can."""
    rng = np.random.default_rng(11)
    training, _ = _paths_day(rng, 30_000)
    day, channel = _paths_day(rng, 6_000)
    every_segment = ("channel_code", "mcc_code", "country_code")
    assert segment_collapses(training, day, every_segment, 0.5) == ()  # a healthy day: nothing in any segment
    atm_down = {**day, "amount": np.where(channel == "atm", 40.0, day["amount"])}
    assert segment_collapses(training, atm_down, ("channel_code",), 0.5) == ()
    assert segment_collapses(training, atm_down, every_segment, 0.5) == (f"amount@mcc_code={int(ATM_MCC)}",)
    contactless_down = {**day, "amount": np.where(channel == "contactless", 40.0, day["amount"])}
    assert "amount@channel_code=11" in segment_collapses(training, contactless_down, every_segment, 0.5)


def test_a_merchant_feature_is_not_judged_within_a_segment_where_its_payments_are_a_few_merchants():
    """A merchant category of 400 payments at 4 merchants: in training 1 in 20 of them had a recent
    fraud report (merchant_fraud_rate_1d > 0 for its ~100 payments, 6% of the category's rows); on a
    healthy day none had one. Per payment that is 0 of an expected 24 (chance 1e-11); per merchant, 0 of
    an expected 0.2, which is no evidence. The payment's own amount stuck there still is."""
    rng = np.random.default_rng(12)
    training = {"mcc_code": np.full(8_000, 42.0), "amount": rng.gamma(2.0, 30.0, 8_000),
                "merchant_fraud_rate_1d": np.where(np.arange(8_000) % 100 < 6, 0.02, 0.0)}
    day = {"mcc_code": np.full(400, 42.0), "amount": rng.gamma(2.0, 30.0, 400), "merchant_fraud_rate_1d": np.zeros(400)}
    assert segment_collapses(training, day, ("mcc_code",), 0.5) == ()
    assert segment_collapses(training, {**day, "amount": np.full(400, 40.0)}, ("mcc_code",), 0.5) == ("amount@mcc_code=42",)


def test_a_segment_too_small_to_judge_is_skipped():
    rng = np.random.default_rng(8)
    training, day = _channels_day(rng, 20_000), _channels_day(rng, 600)  # ~150 rows of code 4
    broken = {**day, "amount": np.where(day["channel_code"] == 4.0, 44.71, day["amount"])}
    assert segment_collapses(training, broken, ("channel_code",), 0.5) == ()


def test_broken_inputs_name_a_feature_stuck_all_day_once_and_one_stuck_in_a_segment_by_its_segment():
    rng = np.random.default_rng(9)
    training, day = _channels_day(rng, 20_000), _channels_day(rng, 3_000)
    everywhere = {**day, "amount": np.full(3_000, 44.71)}
    assert broken_inputs(training, everywhere, 0.99, ("channel_code",), 0.5) == ("amount",)
    one_channel = {**day, "amount": np.where(day["channel_code"] == 5.0, 44.71, day["amount"])}
    assert broken_inputs(training, one_channel, 0.99, ("channel_code",), 0.5) == ("amount@channel_code=5",)
    assert broken_inputs(training, one_channel, 0.99) == ()  # segments not looked at


def test_amounts_of_one_acquirer_in_minor_units_leave_the_training_range_and_healthy_ones_do_not():
    rng = np.random.default_rng(10)
    training = rng.lognormal(3.5, 1.0, 20_000)
    day = rng.lognormal(3.5, 1.0, 3_000)
    healthy = out_of_range_share(training, day)
    assert healthy < 0.01  # ~0.002 expected: the 0.1% tails on both sides
    acquirer = rng.random(3_000) < 0.12
    in_cents = np.where(acquirer, day * 100.0, day)
    assert 0.05 < out_of_range_share(training, in_cents) <= acquirer.mean()  # most, not all, leave the range
    assert out_of_range_share(training, np.r_[day[:990], [np.nan] * 10]) >= 10 / 1000  # non-finite is outside
    assert math.isnan(out_of_range_share([np.nan], day)) and math.isnan(out_of_range_share(training, []))


def test_only_the_named_features_past_the_share_are_out_of_range():
    rng = np.random.default_rng(11)
    training = {"amount": rng.lognormal(3.5, 1.0, 20_000), "merchant_tx_count_30d": rng.poisson(50, 20_000) * 1.0}
    grown = {"amount": rng.lognormal(3.5, 1.0, 2_000), "merchant_tx_count_30d": rng.poisson(400, 2_000) * 1.0}
    names = ("amount",)
    assert out_of_range_features(training, grown, names, 0.02) == ()  # a count outgrowing training: not named
    assert out_of_range_features(training, grown, ("amount", "merchant_tx_count_30d"), 0.02) == ("merchant_tx_count_30d",)
    scaled = {**grown, "amount": grown["amount"] * np.where(rng.random(2_000) < 0.1, 100.0, 1.0)}
    assert out_of_range_features(training, scaled, names, 0.02) == ("amount",)
    assert out_of_range_features(training, scaled, names, 0.0) == ()  # off
    assert out_of_range_features(training, {k: v[:150] for k, v in scaled.items()}, names, 0.02) == ()  # too few rows
