"""A merchant with 2 M payments in 30 days: one key's whole history in one kernel call, and exact."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pipeline.features import definitions as fd
from pipeline.features.params import FeatureParams
from pipeline.features.transforms import build_features
from tests.features.test_transforms import LABEL_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PAYMENTS = 2_000_000
T0_SECONDS = 1_768_003_200  # 2026-01-10T00:00:00Z


def test_a_two_million_payment_merchant_completes_with_exact_counts(spark):
    # One payment per second at merchant "big" (23 days), spread over 50k cards, plus a small merchant.
    tx = (spark.range(PAYMENTS)
          .select(F.concat(F.lit("t"), F.col("id").cast("string")).alias("transaction_id"),
                  F.concat(F.lit("c"), (F.col("id") % 50_000).cast("string")).alias("card_id"),
                  F.when(F.col("id") % 1000 == 7, F.lit("small")).otherwise(F.lit("big")).alias("merchant_id"),
                  F.timestamp_seconds(F.lit(T0_SECONDS) + F.col("id")).alias("event_time"),
                  (F.col("id") % 100 + 0.5).cast("double").alias("amount"),
                  F.lit("5411").alias("mcc"), F.lit("ecommerce").alias("channel"), F.lit("DE").alias("country")))
    labels = spark.createDataFrame([], LABEL_SCHEMA)
    rows = build_features(tx, labels, FeatureParams(), partitions=4)

    def probe(tid, column):
        return F.max(F.when(F.col("transaction_id") == tid, F.col(column))).alias(f"{tid}:{column}")

    # One Spark job for every check (each action would recompute both shuffles).
    got = rows.agg(F.count(F.lit(1)).alias("rows"), probe("t1999999", fd.merchant_count(30)),
                   probe("t1000000", fd.merchant_count(1)), probe("t0", fd.merchant_count(30))).first()

    def big_payments(lo, hi):  # ids in [lo, hi) that went to "big" (1 in 1000 went to "small")
        return sum(1 for i in range(lo, hi) if i % 1000 != 7)

    assert got["rows"] == PAYMENTS
    assert got[f"t1999999:{fd.merchant_count(30)}"] == big_payments(0, PAYMENTS - 1)
    assert got[f"t1000000:{fd.merchant_count(1)}"] == big_payments(1_000_000 - 86_400, 1_000_000)
    assert got[f"t0:{fd.merchant_count(30)}"] == 0.0
