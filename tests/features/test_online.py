"""Online features (one payment at a time, in-memory histories) equal the Spark dataset's rows."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from pipeline.features import definitions as fd
from pipeline.features.online import OnlineFeatureState, Payment
from pipeline.features.transforms import FeatureParams, build_features
from tests.features.test_transforms import DAY_DELAY, LABEL_SCHEMA, T0, TX_SCHEMA, D, _random_stream, tx

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
