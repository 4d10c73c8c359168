"""Point-in-time features through Spark (the kernel applied per key) on tiny frames (no Kafka, no storage)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.features import definitions as fd
from pipeline.features.kernel import categorical_codes
from pipeline.features.params import FeatureParams
from pipeline.features.transforms import build_features, labels_as_of
from tests.features import spark_reference

pytestmark = pytest.mark.spark

TX_SCHEMA = ("transaction_id string, card_id string, merchant_id string, event_time timestamp, amount double, "
             "mcc string, channel string, country string")
LABEL_SCHEMA = "transaction_id string, is_fraud boolean, reported_at timestamp"
T0 = datetime(2026, 1, 10, tzinfo=UTC)  # a Saturday
H = timedelta(hours=1)
D = timedelta(days=1)


def tx(tid, card, merchant, at, amount, mcc="5411", channel="ecommerce", country="DE"):
    return (tid, card, merchant, at, float(amount), mcc, channel, country)


DAY_DELAY = FeatureParams(label_delay_hours=24)


def features(spark, transactions, labels=(), params=DAY_DELAY) -> dict[str, dict]:
    out = build_features(spark.createDataFrame(list(transactions), TX_SCHEMA),
                         spark.createDataFrame(list(labels), LABEL_SCHEMA), params)
    return {r["transaction_id"]: r.asDict() for r in out.collect()}


def test_card_windows_see_only_strictly_earlier_transactions(spark):
    f = features(spark, [tx("a", "c", "m1", T0, 10), tx("b", "c", "m2", T0 + H, 20), tx("b2", "c", "m3", T0 + H, 30),
                         tx("d", "c", "m1", T0 + 25 * H, 40), tx("e", "c", "m1", T0 + 8 * D, 50),
                         tx("x", "other", "m1", T0 + 2 * H, 999)])
    d = f["d"]
    # 1 day before d is [T0+1h, T0+25h): both T0+1h payments, not the one at T0.
    assert (d[fd.card_count(1)], d[fd.card_mean(1)]) == (2.0, 25.0)
    assert d[fd.card_std(1)] == pytest.approx(math.sqrt(50.0))
    assert (d[fd.card_count(7)], d[fd.card_mean(7)], d[fd.card_std(7)]) == (3.0, 20.0, 10.0)
    assert d[fd.CARD_SECONDS_SINCE_PREV] == 24 * 3600.0
    assert d[fd.CARD_DISTINCT_MERCHANTS_1D] == 2.0
    # Same-instant payments do not see each other; the first payment has no history at all.
    assert f["b"][fd.card_count(1)] == f["b2"][fd.card_count(1)] == 1.0
    assert f["b"][fd.CARD_SECONDS_SINCE_PREV] == 3600.0
    a = f["a"]
    assert (a[fd.card_count(30)], a[fd.card_mean(30)], a[fd.card_std(30)]) == (0.0, 0.0, 0.0)
    assert a[fd.CARD_SECONDS_SINCE_PREV] == fd.NO_PREVIOUS_SECONDS
    assert a[fd.CARD_AMOUNT_TO_MEAN_30D] == fd.NO_HISTORY_AMOUNT_RATIO
    e = f["e"]
    assert (e[fd.card_count(1)], e[fd.card_count(7)], e[fd.card_count(30)]) == (0.0, 1.0, 4.0)
    assert e[fd.CARD_AMOUNT_TO_MEAN_30D] == 2.0  # 50 / mean(10, 20, 30, 40)
    assert f["x"][fd.card_count(30)] == 0.0  # other cards are not this card's history


def test_merchant_fraud_rate_uses_reports_only_after_the_label_delay(spark):
    transactions = [tx("A", "c1", "m", T0 + 10 * H, 5), tx("B", "c2", "m", T0 + D + 10 * H, 5),
                    tx("C", "c3", "m", T0 + 2 * D + 10 * H, 5), tx("E", "c4", "m", T0 + 2 * D + 12 * H, 5)]
    labels = [("A", True, T0 + D + 9 * H),  # known (24h delay) at T0+2d+9h: before C, after B
              ("B", True, T0 + D + 12 * H)]  # known exactly at E's time: not strictly before it
    f = features(spark, transactions, labels)
    assert f["B"][fd.merchant_fraud_rate(7)] == 0.0
    assert (f["C"][fd.merchant_count(1)], f["C"][fd.merchant_fraud_rate(1)]) == (1.0, 1.0)
    assert (f["E"][fd.merchant_count(1)], f["E"][fd.merchant_count(7)]) == (1.0, 3.0)
    assert f["E"][fd.merchant_fraud_rate(7)] == pytest.approx(1 / 3)
    no_delay = features(spark, transactions, labels, FeatureParams(label_delay_hours=0))
    assert no_delay["B"][fd.merchant_fraud_rate(7)] == 1.0  # A's report came an hour before B
    assert no_delay["C"][fd.merchant_fraud_rate(7)] == 1.0  # 2 known frauds / 2 payments


def test_reports_on_transactions_older_than_the_match_period_are_ignored(spark):
    transactions = [tx("old", "c1", "m", T0, 5), tx("now", "c2", "m", T0 + 100 * D, 5)]
    labels = [("old", True, T0 + 95 * D)]
    f = features(spark, transactions, labels, FeatureParams(label_delay_hours=0, label_match_days=90))
    assert f["now"][fd.merchant_fraud_rate(30)] == 0.0
    f = features(spark, transactions, labels, FeatureParams(label_delay_hours=0, label_match_days=120))
    assert f["now"][fd.merchant_fraud_rate(30)] == 1.0  # capped at 1: one fraud, no payment in the window


def test_time_features_are_utc(spark):
    f = features(spark, [tx("night", "c", "m", T0 + 3 * H, 1), tx("day", "c", "m", T0 + 2 * D + 14 * H, 1)])
    assert [f["night"][k] for k in fd.TIME_FEATURES] == [3.0, 5.0, 1.0, 1.0]  # Saturday 03:00
    assert [f["day"][k] for k in fd.TIME_FEATURES] == [14.0, 0.0, 0.0, 0.0]  # Monday 14:00


def test_categorical_codes_match_the_python_definition():
    values = ["5411", "ecommerce", "DE", "", None, "ünïcode", "0000", "5411"]
    got = categorical_codes({"mcc": values, "channel": values, "country": values})
    assert got["mcc_code"].tolist() == [fd.categorical_code(v, 512) for v in values]
    assert got["country_code"].tolist() == [fd.categorical_code(v, 256) for v in values]


def test_reference_spark_codes_match_the_python_definition(spark):
    values = ["5411", "ecommerce", "DE", "", None, "ünïcode", "0000"]
    df = spark.createDataFrame([(v,) for v in values], "v string")
    got = [r[0] for r in df.select(spark_reference.categorical_code_column(df["v"], 512)).collect()]
    assert got == [fd.categorical_code(v, 512) for v in values]


def test_labels_as_of_take_the_latest_report_before_the_cutoff(spark):
    labels = spark.createDataFrame([("t1", True, T0), ("t1", False, T0 + 2 * D), ("t2", True, T0 + D),
                                    ("t3", False, T0), ("t3", True, T0)], LABEL_SCHEMA)
    before_clearing = {r[0]: r[1] for r in labels_as_of(labels, T0 + D + H).collect()}
    after_clearing = {r[0]: r[1] for r in labels_as_of(labels, T0 + 3 * D).collect()}
    assert before_clearing == {"t1": 1, "t2": 1, "t3": 1}  # equal times: the fraud report wins
    assert after_clearing == {"t1": 0, "t2": 1, "t3": 1}
    assert {r[0] for r in labels_as_of(labels, T0).collect()} == set()  # cutoff is exclusive


def _random_stream(rng: random.Random, n: int, start: datetime, span: timedelta, prefix: str):
    out = []
    for i in range(n):
        at = start + timedelta(seconds=rng.randint(0, int(span.total_seconds())))
        out.append(tx(f"{prefix}{i}", f"card-{rng.randint(0, 4)}", f"m-{rng.randint(0, 2)}", at,
                      round(rng.uniform(1, 500), 2), rng.choice(["5411", "5812", None]),
                      rng.choice(["ecommerce", "atm"]), rng.choice(["DE", "FR"])))
    return out


@pytest.mark.parametrize("seed", [1, 2])
def test_later_transactions_and_later_reports_never_change_earlier_features(spark, seed):
    rng = random.Random(seed)
    cut = T0 + 10 * D
    early = _random_stream(rng, 60, T0, cut - T0, "e")
    labels = [(t[0], rng.random() < 0.7, t[3] + timedelta(hours=rng.randint(1, 72))) for t in early[::4]]
    labels = [lab for lab in labels if lab[2] < cut - D]  # already known (24h delay) before the cut
    later_tx = _random_stream(rng, 40, cut, 10 * D, "l") + [tx("tie", "card-1", "m-1", cut, 7.0)]
    later_labels = [(t[0], True, cut + timedelta(hours=rng.randint(0, 200))) for t in early + later_tx[:10]]
    base = features(spark, early, labels)
    grown = features(spark, early + later_tx, labels + later_labels)
    for tid, row in base.items():
        if row["event_time"].timestamp() < cut.timestamp():  # collect() gives naive local time
            assert grown[tid] == row, tid  # bit for bit, every column


def test_features_do_not_depend_on_input_order(spark):
    rng = random.Random(7)
    stream = _random_stream(rng, 80, T0, 5 * D, "s")
    labels = [(t[0], True, t[3] + D) for t in stream[::5]]
    forward = features(spark, stream, labels)
    backward = features(spark, list(reversed(stream)), list(reversed(labels)))
    assert forward == backward


@pytest.mark.parametrize("seed", [3, 4])
def test_kernel_matches_the_spark_expression_reference(spark, seed):
    """Old (Spark range frames) vs new (kernel per key) on random data with ties, gaps, late reports,
    zero amounts and cards without history: every version-1 feature agrees within 1e-9."""
    rng = random.Random(seed)
    stream = _random_stream(rng, 250, T0, 45 * D, "r")
    stream += [tx(f"tie{i}", "card-1", "m-1", T0 + 3 * D, 10.0 * i) for i in range(3)]  # same instant
    stream += [tx("zero", "card-2", "m-0", T0 + 4 * D, 0.0), tx("alone", "lonely", "m-9", T0 + 44 * D, 3.0)]
    labels = [(t[0], rng.random() < 0.6, t[3] + timedelta(hours=rng.randint(0, 24 * 20))) for t in stream[::3]]
    labels += [(stream[5][0], True, stream[5][3] + 40 * D)]  # a report long after its payment
    tx_df = spark.createDataFrame(stream, TX_SCHEMA)
    label_df = spark.createDataFrame(labels, LABEL_SCHEMA)
    new = {r["transaction_id"]: r.asDict() for r in build_features(tx_df, label_df, DAY_DELAY).collect()}
    old = {r["transaction_id"]: r.asDict()
           for r in spark_reference.build_features(tx_df, label_df, DAY_DELAY).collect()}
    assert new.keys() == old.keys()
    for tid, row in old.items():
        for name in spark_reference.V1_FEATURE_COLUMNS:
            assert new[tid][name] == pytest.approx(row[name], rel=1e-9, abs=1e-9), (tid, name)
