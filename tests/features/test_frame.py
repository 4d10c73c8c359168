"""Feature rows from pandas frames (no Spark) equal the Spark job's rows."""

from __future__ import annotations

import random
from datetime import timedelta

import pandas as pd
import pytest

from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.features.transforms import build_features
from tests.features.test_transforms import DAY_DELAY, LABEL_SCHEMA, T0, TX_SCHEMA, D, _random_stream, tx

pytestmark = pytest.mark.spark


def test_frame_features_equal_the_spark_rows(spark):
    rng = random.Random(21)
    stream = _random_stream(rng, 300, T0, 40 * D, "f")
    stream += [tx(f"tie{i}", "card-1", "m-1", T0 + 3 * D, 10.0 * i) for i in range(3)] + [
        tx("zero", "card-2", "m-0", T0 + 4 * D, 0.0)]
    labels = [(t[0], rng.random() < 0.7, t[3] + timedelta(hours=rng.randint(0, 24 * 15))) for t in stream[::3]]
    offline = {r["transaction_id"]: r.asDict() for r in build_features(
        spark.createDataFrame(stream, TX_SCHEMA), spark.createDataFrame(labels, LABEL_SCHEMA), DAY_DELAY).collect()}
    tx_frame = pd.DataFrame(stream, columns=["transaction_id", "card_id", "merchant_id", "event_time", "amount",
                                             "mcc", "channel", "country"])
    label_frame = pd.DataFrame(labels, columns=["transaction_id", "is_fraud", "reported_at"])
    frame = build_feature_frame(tx_frame, label_frame, DAY_DELAY)
    assert frame["transaction_id"].tolist() == tx_frame["transaction_id"].tolist()  # input order kept
    for row in frame.to_dict("records"):
        for name in fd.FEATURE_COLUMNS:
            assert row[name] == pytest.approx(offline[row["transaction_id"]][name], rel=1e-9, abs=1e-9), name
