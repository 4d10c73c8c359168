"""Online features (one payment at a time, in-memory histories) equal the Spark dataset's rows."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from pipeline.features import definitions as fd
from pipeline.features.online import OnlineFeatureState, Payment
from pipeline.features.params import FeatureParams
from pipeline.features.transforms import build_features
from tests.features.test_transforms import DAY_DELAY, LABEL_SCHEMA, T0, TX_SCHEMA, D, H, _random_stream, tx

US = 1_000_000


def _micros(at) -> int:
    return int(at.timestamp()) * US + at.microsecond


def _payment(row) -> Payment:
    tid, card, merchant, at, amount, mcc, channel, country = row
    return Payment(tid, card, merchant, _micros(at), amount, mcc, channel, country)


def replay_online(stream, labels, params: FeatureParams) -> dict[str, dict]:
    """Events in time order as a scorer sees them: each payment is scored, then remembered; each
    report is fed when it is made, so reports arrive between payments."""
    timeline = [(_micros(r[3]), 1, r) for r in stream] + [(_micros(lab[2]), 0, lab) for lab in labels]
    state = OnlineFeatureState(params)
    out = {}
    for _, kind, item in sorted(timeline, key=lambda e: (e[0], e[1])):
        if kind == 0:
            state.observe_label(item[0], item[1], _micros(item[2]))
            continue
        payment = _payment(item)
        out[payment.transaction_id] = state.features(payment)
        state.observe_payment(payment)
    return out


@pytest.mark.spark
@pytest.mark.parametrize("seed", [11, 12])
def test_online_replay_equals_the_spark_rows(spark, seed):
    rng = random.Random(seed)
    stream = _random_stream(rng, 300, T0, 40 * D, "o")
    stream += [tx(f"tie{i}", "card-1", "m-1", T0 + 3 * D, 10.0 * i) for i in range(3)]  # same instant
    stream += [tx("zero", "card-2", "m-0", T0 + 4 * D, 0.0), tx("new", "card-new", "m-new", T0 + 39 * D, 5.0)]
    labels = [(t[0], rng.random() < 0.7, t[3] + timedelta(hours=rng.randint(0, 24 * 15))) for t in stream[::3]]
    labels += [(stream[7][0], True, stream[7][3] + 2 * D), (stream[7][0], True, stream[7][3] + 1 * D)]  # 2 reports
    labels += [("never-landed", True, T0 + 5 * D)]
    offline = {r["transaction_id"]: r.asDict() for r in build_features(
        spark.createDataFrame(stream, TX_SCHEMA), spark.createDataFrame(labels, LABEL_SCHEMA), DAY_DELAY).collect()}
    online = replay_online(stream, labels, DAY_DELAY)
    assert online.keys() == offline.keys()
    for tid, row in offline.items():
        for name in fd.FEATURE_COLUMNS:
            assert online[tid][name] == pytest.approx(row[name], rel=1e-9, abs=1e-9), (tid, name)


def test_a_report_before_its_payment_counts_once_the_payment_arrives():
    state = OnlineFeatureState(FeatureParams(label_delay_hours=0))
    state.observe_label("a", True, _micros(T0 + D))  # e.g. replayed out of order
    state.observe_payment(_payment(tx("a", "c1", "m", T0, 5.0)))
    later = state.features(_payment(tx("b", "c2", "m", T0 + 2 * D, 5.0)))
    assert later[fd.merchant_fraud_rate(7)] == 1.0  # 1 known fraud / 1 payment


def test_fraud_reports_whose_payment_never_comes_expire_once_no_window_can_read_them():
    state = OnlineFeatureState(DAY_DELAY)
    for i in range(20):  # reports of payments from before the state's history (e.g. seeded late)
        state.observe_label(f"unknown{i}", True, _micros(T0 + i * D))
    state.observe_payment(_payment(tx("late", "c1", "m", T0 + 5 * D, 1.0)))  # one report's payment turns up
    state.observe_label("late", True, _micros(T0 + 6 * D))
    assert state.size()["fraud_reports"] == 21
    # At T0 + 100 days a report made before T0 + 10 days can no longer feed any window (label_match_days 90).
    assert state.expire(_micros(T0 + 100 * D)) is True
    kept = {f"unknown{i}" for i in range(10, 20)}
    assert state.size()["fraud_reports"] == len(kept)
    assert set(state._first_fraud_report) == kept
    # A kept orphan still counts when its payment arrives, as before.
    state.observe_payment(_payment(tx("unknown19", "c2", "m2", T0 + 19 * D - H, 1.0)))
    query = _payment(tx("q", "c3", "m2", T0 + 21 * D, 1.0))
    assert state.features(query)[fd.merchant_fraud_rate(30)] == 1.0


def test_expiry_bounds_memory_and_keeps_what_windows_read():
    state = OnlineFeatureState(DAY_DELAY)
    for i in range(50):
        state.observe_payment(_payment(tx(f"p{i}", f"c{i % 5}", "m", T0 + i * D, 1.0)))
    query = _payment(tx("q", "c0", "m", T0 + 50 * D, 1.0))
    before = state.features(query)
    state.expire(query.ts_us)
    assert state.features(query) == before  # nothing a window reads was dropped
    size = state.size()
    assert size["card_events"] == 30 and size["cards"] == 5  # only the last 30 days of payments


def _observed_state(seed: int, n: int = 400) -> tuple[OnlineFeatureState, list]:
    rng = random.Random(seed)
    stream = _random_stream(rng, n, T0, 40 * D, "h")
    state = OnlineFeatureState(DAY_DELAY)
    for row in stream:
        state.observe_payment(_payment(row))
    for row in stream[::5]:
        state.observe_label(row[0], True, _micros(row[3] + timedelta(hours=rng.randint(0, 48))))
    return state, stream


@pytest.mark.parametrize("seed", [3, 4])
def test_features_of_many_payments_equal_one_at_a_time(seed):
    state, stream = _observed_state(seed)
    rng = random.Random(seed)
    batch = [_payment(row) for row in _random_stream(rng, 30, T0 + 20 * D, 25 * D, "q")]
    batch += [_payment(tx("same-instant", "card-1", "m-1", T0 + 30 * D, 5.0)),
              _payment(tx("same-instant-2", "card-1", "m-2", T0 + 30 * D, 6.0)),
              _payment(tx("unseen", "card-new", "m-new", T0 + 31 * D, 7.0, country="JP")),
              _payment(stream[10]), _payment(stream[10])]  # a held payment, twice
    one_by_one = [state.features(p) for p in batch]
    together = state.features_many(batch)
    assert together == one_by_one
    assert all(list(row) == list(fd.FEATURE_COLUMNS) for row in together)
    assert [type(v) for v in together[0].values()] == [type(v) for v in one_by_one[0].values()]


def test_expiry_is_incremental_bounded_and_ends_where_a_full_pass_does():
    def filled() -> OnlineFeatureState:
        state = OnlineFeatureState(DAY_DELAY)
        for i in range(300):  # a payment every 4 hours over 50 days, each on its own card; 7 merchants
            state.observe_payment(_payment(tx(f"p{i}", f"c{i}", f"m{i % 7}", T0 + i * 4 * H, 1.0 + i)))
        state.observe_payment(_payment(tx("p-c1", "c1", "m1", T0 + 59 * D, 2.0)))
        return state

    now = _micros(T0 + 60 * D)
    query = _payment(tx("q", "c1", "m1", T0 + 60 * D, 1.0))
    full, sliced = filled(), filled()
    before = full.features(query)
    assert full.expire(now) is True
    sizes = [sliced.size()]
    while not sliced.expire(now, budget=10):
        sizes.append(sliced.size())
    sizes.append(sliced.size())
    # Every call visited at most 10 keys, so at most 10 of the 180 cards older than 30 days went per call.
    assert all(0 <= a["cards"] - b["cards"] <= 10 for a, b in zip(sizes, sizes[1:], strict=False))
    assert len(sizes) >= 180 // 10
    assert sliced.size() == full.size()
    assert full.size()["cards"] == full.size()["card_events"] == 300 - 180 + 1
    assert sliced.features(query) == full.features(query) == before
    assert sliced.expire(now, budget=10) is True  # nothing left: a further call visits nothing


def test_expiry_never_visits_keys_with_nothing_old():
    state = OnlineFeatureState(DAY_DELAY)
    for i in range(50):
        state.observe_payment(_payment(tx(f"old{i}", f"old{i}", "m-old", T0, 1.0)))
    for i in range(1000):
        state.observe_payment(_payment(tx(f"new{i}", f"new{i}", "m-new", T0 + 40 * D, 1.0)))
    # 50 old cards, one old merchant, 50 old payments (label_match_days 90: payments stay indexed).
    assert state.expire(_micros(T0 + 40 * D), budget=51) is True
    assert state.size()["cards"] == 1000 and state.size()["merchants"] == 1
