"""The feature table's kernel pass (a few queries against a long coded history) against the
whole-history pass Spark runs: the same values, whatever integers code the ids, and whether the
history was sorted afresh or carried from the night before with the new day merged in."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.features.arrow_kernel import (
    CodedPayments,
    SortedPayments,
    feature_rows,
    key_time_order,
    merge_sorted,
    sort_payments,
    sorted_feature_rows,
)
from pipeline.features.kernel import US_PER_DAY, CardEvents, KeyedTimes, card_features, merchant_features

T0 = 1_768_003_200_000_000  # 2026-01-10T00:00:00Z
MINUTE = 60_000_000


def history(seed: int, time_ordered: bool, n: int = 4000):
    """31 days of payments on minute boundaries (same-instant payments of one card happen), ids coded
    sparsely as a vocabulary codes them, and fraud-known instants of a few merchants. Time-ordered
    as the feature table reads them, or in any order."""
    rng = np.random.default_rng(seed)
    card = rng.integers(0, 40, n) * 7 + 3
    merchant = rng.integers(0, 15, n) * 5 + 1000
    country = rng.integers(0, 4, n) * 11 + 2
    ts = T0 + rng.integers(0, 31 * 24 * 60, n) * MINUTE
    amount = np.round(rng.gamma(2.0, 40.0, n), 2)
    fraud = KeyedTimes(rng.choice(np.unique(merchant), 60), T0 + rng.integers(0, 31 * 24 * 60, 60) * MINUTE)
    order = np.argsort(ts, kind="stable") if time_ordered else np.arange(n)
    return CodedPayments(card[order], merchant[order], country[order], ts[order], amount[order]), fraud


def whole_history_pass(h: CodedPayments, fraud: KeyedTimes) -> dict[str, np.ndarray]:
    """Every payment's features with the whole history as queries (the Spark partitions' way)."""
    by_card = np.lexsort((h.ts_us, h.card))
    events = CardEvents(h.card[by_card], h.ts_us[by_card], h.amount[by_card], h.merchant[by_card], h.country[by_card])
    out = {}
    for name, values in card_features(events, events).items():
        out[name] = np.empty(len(values))
        out[name][by_card] = values
    by_merchant, fraud_order = np.lexsort((h.ts_us, h.merchant)), np.lexsort((fraud.ts_us, fraud.key))
    payments = KeyedTimes(h.merchant[by_merchant], h.ts_us[by_merchant])
    known = KeyedTimes(fraud.key[fraud_order], fraud.ts_us[fraud_order])
    for name, values in merchant_features(payments, known, payments).items():
        out[name] = np.empty(len(values))
        out[name][by_merchant] = values
    return out


def raw_rows(h: CodedPayments, rows: np.ndarray) -> pa.Table:
    n = len(rows)
    return pa.table({"transaction_id": [f"tx-{i}" for i in rows], "card_id": [f"card-{c}" for c in h.card[rows]],
                     "merchant_id": [f"m-{m}" for m in h.merchant[rows]],
                     "event_time": pa.array(h.ts_us[rows]).cast(pa.timestamp("us", tz="UTC")),
                     "amount": h.amount[rows], "mcc": ["5411"] * n, "channel": ["pos"] * n,
                     "country": [f"c{c}" for c in h.country[rows]]})


@pytest.mark.parametrize("time_ordered", [True, False])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_last_day_against_its_history_equals_the_whole_history_pass(seed, time_ordered):
    h, fraud = history(seed, time_ordered)
    last_day = np.flatnonzero(h.ts_us >= T0 + 30 * US_PER_DAY)
    wanted = last_day[np.random.default_rng(seed).permutation(len(last_day))]  # any order in, that order out
    rows = feature_rows(h, fraud, wanted, raw_rows(h, wanted))
    expected = whole_history_pass(h, fraud)
    assert rows.column("transaction_id").to_pylist() == [f"tx-{i}" for i in wanted]
    assert len(expected) > 20
    for name, values in expected.items():
        np.testing.assert_array_equal(rows.column(name).to_numpy(), values[wanted], err_msg=name)


def test_key_time_order_sorts_by_key_then_time_whichever_sort_it_takes():
    rng = np.random.default_rng(0)
    ts = T0 + rng.integers(0, 10**6, 500) * MINUTE
    cases = [(rng.integers(0, 30, 500), np.sort(ts)),  # time-ordered, small keys: a radix sort of the keys
             (rng.integers(0, 30, 500), ts),  # one sort of key and time together
             (rng.integers(0, 30, 500) * 2**50, ts)]  # past int64 together: a lexsort
    for key, ts in cases:
        order = key_time_order(key, ts)
        assert sorted(order.tolist()) == list(range(500))
        assert np.all(np.diff(key[order]) >= 0)
        assert np.all(np.diff(ts[order])[np.diff(key[order]) == 0] >= 0)


def _rows(p: CodedPayments, rows: np.ndarray) -> CodedPayments:
    return CodedPayments(p.card[rows], p.merchant[rows], p.country[rows], p.ts_us[rows], p.amount[rows])


def _as_rows(p: SortedPayments) -> tuple[list, list]:
    """The payments of both orders as sorted row lists (what they hold, whatever their ties' order)."""
    c, m = p.by_card, p.by_merchant
    by_card = zip(c.card.tolist(), c.ts_us.tolist(), c.merchant.tolist(), c.country.tolist(), c.amount.tolist(),
                  strict=True)
    return sorted(by_card), sorted(zip(m.key.tolist(), m.ts_us.tolist(), strict=True))


def _assert_sorted(p: SortedPayments) -> None:
    for key, ts in ((p.by_card.card, p.by_card.ts_us), (p.by_merchant.key, p.by_merchant.ts_us)):
        assert np.all(np.diff(key) >= 0) and np.all(np.diff(ts)[np.diff(key) == 0] >= 0)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_carried_history_with_the_new_day_merged_gives_the_features_of_one_sorted_afresh(seed):
    h, fraud = history(seed, time_ordered=True)
    new_day = h.ts_us >= T0 + 30 * US_PER_DAY
    wanted = np.flatnonzero(new_day)
    carried = sort_payments(_rows(h, np.flatnonzero(~new_day)))  # last night's, stored sorted
    merged = merge_sorted(carried, sort_payments(_rows(h, wanted)))
    _assert_sorted(merged)
    assert _as_rows(merged) == _as_rows(sort_payments(h))
    rows = sorted_feature_rows(merged, fraud, _rows(h, wanted), raw_rows(h, wanted))
    assert rows.equals(feature_rows(h, fraud, wanted, raw_rows(h, wanted)))
    for name, values in whole_history_pass(h, fraud).items():
        np.testing.assert_array_equal(rows.column(name).to_numpy(), values[wanted], err_msg=name)
    kept = merged.since(T0 + US_PER_DAY)  # the next night's: the oldest day dropped, both orders kept
    _assert_sorted(kept)
    assert _as_rows(kept) == _as_rows(sort_payments(_rows(h, np.flatnonzero(h.ts_us >= T0 + US_PER_DAY))))
    # A night cuts the carried history to its lookback as it merges: the same rows in the same order.
    cut = merge_sorted(carried, sort_payments(_rows(h, wanted)), T0 + US_PER_DAY)
    for got, want in ((cut.by_card, kept.by_card), (cut.by_merchant, kept.by_merchant)):
        for name, values in vars(want).items():
            np.testing.assert_array_equal(getattr(got, name), values, err_msg=name)


def test_merging_places_each_new_payment_by_key_then_time_whatever_the_codes():
    rng = np.random.default_rng(5)
    for top in (40, 2**31 - 1):  # small codes: one int64 axis; codes of a huge vocabulary: a lexsort
        card = rng.integers(0, top, 600)
        card[:300] = card[300:]  # every key in both parts
        ts = T0 + rng.integers(0, 31 * 24 * 60, 600) * MINUTE
        ts[300:310] = ts[:10]  # same key, same instant, across the two parts
        p = CodedPayments(card, card % 7, card % 3, ts, rng.random(600))
        merged = merge_sorted(sort_payments(_rows(p, np.arange(300))), sort_payments(_rows(p, np.arange(300, 600))))
        _assert_sorted(merged)
        assert _as_rows(merged) == _as_rows(sort_payments(p))
