"""The feature kernel against a brute-force reading of the definitions, on hand-made and random events."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.features import definitions as fd
from pipeline.features.kernel import (
    US_PER_DAY,
    US_PER_SECOND,
    CardEvents,
    KeyedTimes,
    card_features,
    merchant_features,
    time_features,
    to_cents,
)

H = 3600 * US_PER_SECOND
T0 = 1_768_003_200 * US_PER_SECOND  # 2026-01-10T00:00:00Z, a Saturday


def events(rows) -> CardEvents:
    """rows: (key, ts_us, amount, merchant, country), sorted here by (key, ts)."""
    rows = sorted(rows, key=lambda r: (r[0], r[1]))
    cols = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    return CardEvents(key=np.array(cols[0], dtype=np.int64), ts_us=np.array(cols[1], dtype=np.int64),
                      amount=np.array(cols[2], dtype=np.float64), merchant=np.array(cols[3], dtype=np.int64),
                      country=np.array(cols[4], dtype=np.int64))


def brute_card(rows, query) -> dict[str, float]:
    """The definitions read literally: loop over the history for one query."""
    key, t, amount, merchant, country = query

    def window(seconds):
        return [r for r in rows if r[0] == key and t - seconds * US_PER_SECOND <= r[1] < t]

    out = {}
    for days in fd.CARD_WINDOWS_DAYS:
        cents = [int(math.floor(min(r[2], (2**31 - 1) / 100) * 100 + 0.5)) for r in window(days * 86400)]
        n = len(cents)
        out[fd.card_count(days)] = float(n)
        out[fd.card_mean(days)] = sum(cents) / n / 100 if n else 0.0
        if n > 1:
            mean = sum(cents) / n
            out[fd.card_std(days)] = math.sqrt(sum((c - mean) ** 2 for c in cents) / (n - 1)) / 100
        else:
            out[fd.card_std(days)] = 0.0
    out[fd.CARD_TX_COUNT_1H] = float(len(window(3600)))
    month = window(30 * 86400)
    out[fd.CARD_SECONDS_SINCE_PREV] = (t - max(r[1] for r in month)) / US_PER_SECOND if month else fd.NO_PREVIOUS_SECONDS
    mean30, std30 = out[fd.card_mean(30)], out[fd.card_std(30)]
    out[fd.CARD_AMOUNT_TO_MEAN_30D] = amount / mean30 if mean30 > 0 else 1.0
    out[fd.CARD_AMOUNT_ZSCORE_30D] = (amount - mean30) / std30 if std30 > 0 else 0.0
    out[fd.CARD_DISTINCT_MERCHANTS_1D] = float(len({r[3] for r in window(86400)}))
    out[fd.CARD_MERCHANT_TX_COUNT_30D] = float(sum(r[3] == merchant for r in month))
    out[fd.CARD_COUNTRY_TX_COUNT_30D] = float(sum(r[4] == country for r in month))
    hour = (t // (3600 * US_PER_SECOND)) % 24
    near = [r for r in month if min((r[1] // (3600 * US_PER_SECOND) - hour) % 24,
                                    (hour - r[1] // (3600 * US_PER_SECOND)) % 24) <= fd.HOUR_SHARE_REACH]
    out[fd.CARD_HOUR_SHARE_30D] = len(near) / len(month) if month else 0.0
    instants = sorted({r[1] for r in month}, reverse=True)
    for step in range(1, fd.SEQUENCE_STEPS + 1):
        at = [r for r in month if r[1] == instants[step - 1]] if step <= len(instants) else []
        cents = [int(math.floor(min(r[2], (2**31 - 1) / 100) * 100 + 0.5)) for r in at]
        out[fd.card_previous(step, "seconds_before")] = ((t - instants[step - 1]) / US_PER_SECOND if at
                                                         else fd.NO_PREVIOUS_SECONDS)
        out[fd.card_previous(step, "amount")] = sum(cents) / 100 if at else 0.0
        out[fd.card_previous(step, "same_merchant")] = float(any(r[3] == merchant for r in at))
        out[fd.card_previous(step, "same_country")] = float(any(r[4] == country for r in at))
    return out


def random_rows(rng, n, keys, span_days, merchants=6, countries=3):
    # Times on a coarse grid so that ties (same card, same instant) and exact window edges are common.
    grid = rng.integers(0, span_days * 24 * 4, size=n) * (US_PER_DAY // 96)
    amounts = np.round(rng.choice([0.0, 0.01, 5.0, 19.99, 250.0, 1e7, 3e9], size=n) * rng.random(n), 2)
    return [(int(rng.integers(keys)), T0 + int(g), float(a), int(rng.integers(merchants)), int(rng.integers(countries)))
            for g, a in zip(grid, amounts, strict=True)]


def test_hand_made_card_history():
    rows = [(0, T0, 10.0, 1, 7), (0, T0 + H, 20.0, 2, 7), (0, T0 + H, 30.0, 3, 8), (0, T0 + 25 * H, 40.0, 1, 7),
            (1, T0 + 2 * H, 999.0, 1, 7)]
    h = events(rows)
    f = card_features(h, h)
    d = 3  # sorted order: key 0 rows by time, then key 1
    # 1 day before T0+25h is [T0+1h, T0+25h): the two T0+1h payments (20, 30), not the one at T0.
    assert (f[fd.card_count(1)][d], f[fd.card_mean(1)][d]) == (2.0, 25.0)
    assert f[fd.card_std(1)][d] == pytest.approx(math.sqrt(50.0), rel=1e-12)
    assert (f[fd.card_count(7)][d], f[fd.card_mean(7)][d], f[fd.card_std(7)][d]) == (3.0, 20.0, 10.0)
    assert f[fd.CARD_SECONDS_SINCE_PREV][d] == 24 * 3600.0
    assert f[fd.CARD_DISTINCT_MERCHANTS_1D][d] == 2.0
    assert f[fd.CARD_MERCHANT_TX_COUNT_30D][d] == 1.0  # merchant 1 once before (at T0)
    assert f[fd.CARD_COUNTRY_TX_COUNT_30D][d] == 2.0  # country 7: T0 and the 20.0 payment
    assert f[fd.CARD_AMOUNT_ZSCORE_30D][d] == pytest.approx((40 - 20) / 10)
    # Same-instant payments do not see each other.
    assert f[fd.card_count(1)][1] == f[fd.card_count(1)][2] == 1.0
    assert f[fd.CARD_TX_COUNT_1H][1] == 1.0  # [t - 1h, t) is closed at t - 1h = T0
    assert f[fd.CARD_TX_COUNT_1H][3] == 0.0
    first = 0
    assert f[fd.CARD_SECONDS_SINCE_PREV][first] == fd.NO_PREVIOUS_SECONDS
    assert f[fd.CARD_AMOUNT_TO_MEAN_30D][first] == fd.NO_HISTORY_AMOUNT_RATIO
    assert f[fd.card_count(30)][4] == 0.0  # another card's payments are not this card's history


def test_the_card_sequence_reads_its_last_instants_most_recent_first():
    rows = [(0, T0 - 31 * US_PER_DAY, 5.0, 1, 7),  # beyond the 30-day lookback of every query below
            (0, T0, 10.0, 1, 7), (0, T0 + H, 20.0, 2, 7), (0, T0 + H, 30.0, 3, 8),  # a tie: one instant
            (0, T0 + 2 * H, 40.0, 3, 9), (1, T0 + 90 * 60 * US_PER_SECOND, 999.0, 3, 9)]
    h = events(rows)
    f = card_features(h, h)
    latest = 4  # card 0 at T0 + 2h, merchant 3, country 9
    assert f[fd.card_previous(1, "seconds_before")][latest] == 3600.0
    assert f[fd.card_previous(1, "amount")][latest] == 50.0  # the tied payments' total
    assert f[fd.card_previous(1, "same_merchant")][latest] == 1.0  # one of the two was at merchant 3
    assert f[fd.card_previous(1, "same_country")][latest] == 0.0  # neither was in country 9
    assert (f[fd.card_previous(2, "seconds_before")][latest], f[fd.card_previous(2, "amount")][latest]) == (7200.0, 10.0)
    # Only two instants in the lookback (the 31-day-old payment is out, card 1's is not this card's).
    assert f[fd.card_previous(3, "seconds_before")][latest] == fd.NO_PREVIOUS_SECONDS
    assert f[fd.card_previous(3, "amount")][latest] == f[fd.card_previous(3, "same_merchant")][latest] == 0.0
    # The tied payments do not see each other: each one's latest instant is T0.
    assert f[fd.card_previous(1, "seconds_before")][2] == f[fd.card_previous(1, "seconds_before")][3] == 3600.0
    assert f[fd.card_previous(1, "seconds_before")][5] == fd.NO_PREVIOUS_SECONDS  # card 1's first payment
    # A card's first payment queried against no history at all (the online form of a new card).
    alone = card_features(events([]), events([(0, T0, 10.0, 1, 7)]))
    assert [alone[fd.card_previous(1, field)][0] for field in fd.SEQUENCE_FIELDS] == [fd.NO_PREVIOUS_SECONDS, 0, 0, 0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_card_features_match_the_definitions_on_random_events(seed):
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, 300, keys=7, span_days=40)
    h = events(rows)
    got = card_features(h, h)
    for i, row in enumerate(sorted(rows, key=lambda r: (r[0], r[1]))):
        want = brute_card(rows, row)
        for name, value in want.items():
            assert got[name][i] == pytest.approx(value, rel=1e-9, abs=1e-9), (name, i)


def test_queries_outside_the_history_see_the_same_windows_as_rows_inside_it():
    """The online form: one new payment queried against a card's history gives the offline row."""
    rng = np.random.default_rng(5)
    rows = sorted(random_rows(rng, 200, keys=1, span_days=35), key=lambda r: (r[0], r[1]))  # as events() orders
    full = events(rows)
    offline = card_features(full, full)
    queried = rng.choice(len(rows), 20, replace=False)
    for j in queried:
        online = card_features(events(rows[:j] + rows[j + 1:]), events([rows[j]]))
        for name in offline:
            assert online[name][0] == offline[name][j], name  # bit-identical, not approximately
    # Not all trivially equal: the queries compared include rows with a history in their windows.
    assert (offline[fd.card_count(1)][queried] > 0).any() and (offline[fd.CARD_TX_COUNT_1H][queried] > 0).any()


@pytest.mark.parametrize("country_scale", [1, 2**17, 2**33])  # one, two and three 16-bit digits to sort by
def test_a_last_day_of_queries_against_its_history_sees_what_the_whole_history_pass_sees(country_scale):
    """A night's form: one day's payments queried all at once against the history that holds them and
    the cards' 40 days before. Window edges and same-instant payments (ties) are common on this grid,
    the queries far fewer than the history's events, so the hour share and the country count search
    the history by value."""
    rng = np.random.default_rng(11)
    rows = [(k, t, a, m, c * country_scale) for k, t, a, m, c in random_rows(rng, 3000, keys=5, span_days=41)]
    rows.sort(key=lambda r: (r[0], r[1]))
    full = events(rows)
    offline = card_features(full, full)
    last = [i for i, r in enumerate(rows) if r[1] >= T0 + 40 * US_PER_DAY]
    queries = events([rows[i] for i in last])
    assert len(full) > 10 * len(queries) > 50
    assert len({(r[0], r[1]) for r in rows}) < len(rows)  # ties among the payments
    night = card_features(full, queries)
    for name in offline:
        np.testing.assert_array_equal(night[name], offline[name][last], err_msg=name)
    assert (night[fd.CARD_COUNTRY_TX_COUNT_30D] > 0).all() and (night[fd.CARD_HOUR_SHARE_30D] > 0).any()


def test_hour_share_wraps_across_midnight_and_reads_only_the_cards_past():
    day = T0 + 3 * US_PER_DAY
    rows = [(0, T0 + 23 * H + 5, 1.0, 1, 1),  # 23:00 neighbours 00:00 of the next day
            (0, T0 + US_PER_DAY + 2 * H, 1.0, 1, 1),  # 02:00: two hours from 00:00, out of reach
            (0, T0 + 2 * US_PER_DAY + 12 * H, 1.0, 1, 1),  # noon: far
            (0, day + 30 * 60 * US_PER_SECOND, 1.0, 1, 1),  # the query, 00:30
            (1, day - 5, 1.0, 1, 1)]  # another card at 23:59:59: not this card's history
    h = events(rows)
    f = card_features(h, h)[fd.CARD_HOUR_SHARE_30D]
    assert f[3] == pytest.approx(1 / 3)
    assert f[0] == 0.0  # no history: the fill
    assert f[4] == 0.0
    # Before 1970 the hour is still the UTC hour (floor division): 23:00 on 1969-12-31 sees 00:00.
    old = events([(0, -H, 1.0, 1, 1), (0, 0, 1.0, 1, 1), (0, 23 * H, 1.0, 1, 1)])
    assert card_features(old, old)[fd.CARD_HOUR_SHARE_30D].tolist() == [0.0, 1.0, 1.0]


def test_zero_and_huge_amounts_stay_finite():
    h = events([(0, T0, 0.0, 1, 1), (0, T0 + H, 0.0, 1, 1), (0, T0 + 2 * H, 1e300, 2, 1), (0, T0 + 3 * H, 5.0, 3, 1)])
    f = card_features(h, h)
    for values in f.values():
        assert np.isfinite(values).all()
    assert f[fd.CARD_AMOUNT_TO_MEAN_30D][2] == fd.NO_HISTORY_AMOUNT_RATIO  # earlier amounts all zero: mean 0
    assert to_cents(np.array([1e300]))[0] == 2**31 - 1


def test_cents_round_half_up_and_clamp_what_is_not_an_amount():
    amounts = np.array([math.nan, math.inf, -math.inf, -0.01, -0.0, 0.005, 0.015, 12.344999, 12.345, 1e300])
    assert to_cents(amounts).tolist() == [0, 2**31 - 1, 0, 0, 0, 1, 2, 1234, 1235, 2**31 - 1]


def test_merchant_counts_and_label_delayed_fraud_rates():
    tx = KeyedTimes(np.array([0, 0, 0, 0]), np.array([T0 + 10 * H, T0 + 34 * H, T0 + 58 * H, T0 + 60 * H]))
    # A's fraud became known at T0+57h (before C, after B); B's exactly at E's time (not before it).
    fraud = KeyedTimes(np.array([0, 0]), np.array([T0 + 57 * H, T0 + 60 * H]))
    f = merchant_features(tx, fraud, tx)
    assert f[fd.merchant_fraud_rate(7)][1] == 0.0
    assert (f[fd.merchant_count(1)][2], f[fd.merchant_fraud_rate(1)][2]) == (1.0, 1.0)
    assert (f[fd.merchant_count(1)][3], f[fd.merchant_count(7)][3]) == (1.0, 3.0)
    assert f[fd.merchant_fraud_rate(7)][3] == pytest.approx(1 / 3)
    assert f[fd.merchant_fraud_rate(30)][0] == 0.0  # nothing before the first payment: rate 0, not NaN


def test_time_features_are_utc():
    f = time_features(np.array([T0, T0 + 7 * H, T0 + 2 * US_PER_DAY + 23 * H]))
    assert f["weekday"].tolist() == [5.0, 5.0, 0.0]  # Saturday, Saturday, Monday
    assert f["hour"].tolist() == [0.0, 7.0, 23.0]
    assert f["is_night"].tolist() == [1.0, 0.0, 0.0]
    assert f["is_weekend"].tolist() == [1.0, 1.0, 0.0]
