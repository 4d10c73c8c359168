"""Spark side of the features: raw-store frames in, point-in-time feature rows out.

Inputs are raw-store frames:

* transactions: ``transaction_id, card_id, merchant_id, event_time (timestamp), amount (double),
  mcc, channel, country`` (transaction_id unique: the raw store is de-duplicated);
* labels: ``transaction_id, is_fraud (boolean), reported_at (timestamp)``.

The windowed features themselves are computed by the one kernel (:mod:`pipeline.features.kernel`),
which Spark applies per key (:mod:`pipeline.features.spark_kernel`) and the scorer applies online.
What stays here is relational: which fraud reports become merchant events (a join on
``transaction_id``) and which label each row gets as of a cutoff.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.datasets.manifest import REPORTED_AT_COLUMN
from pipeline.features import definitions as fd
from pipeline.features.kernel import US_PER_DAY
from pipeline.features.params import FeatureParams
from pipeline.features.spark_kernel import TS_US, apply_feature_kernel


def utc_date(ts_us: Column) -> Column:
    """UTC calendar date of epoch microseconds, independent of the session time zone."""
    return F.date_from_unix_date(F.floor(ts_us / US_PER_DAY).cast("int"))


def with_event_micros(transactions: DataFrame) -> DataFrame:
    """Add the event time as epoch microseconds (the kernel's time axis)."""
    return transactions.withColumn(TS_US, F.unix_micros("event_time"))


def fraud_known_events(tx: DataFrame, labels: DataFrame, params: FeatureParams) -> DataFrame:
    """When each transaction's fraud became usable: ``merchant_id, _ts_us`` (= first fraud report
    time + label delay), one row per transaction with an ``is_fraud=true`` report.

    ``tx`` needs the ``with_event_micros`` column. Reports whose transaction is unknown or happened more
    than ``label_match_days`` before the report are ignored.
    """
    first_report = (labels.filter(F.col("is_fraud"))
                    .groupBy("transaction_id")
                    .agg(F.min(F.unix_micros("reported_at")).alias("_reported_us")))
    match_us = params.label_match_days * US_PER_DAY
    return (first_report.join(tx.select("transaction_id", "merchant_id", TS_US), "transaction_id")
            .filter(F.col(TS_US) >= F.col("_reported_us") - match_us)
            .select("merchant_id", (F.col("_reported_us") + params.label_delay_us).alias(TS_US)))


def build_features(transactions: DataFrame, labels: DataFrame, params: FeatureParams,
                   history: DataFrame | None = None, partitions: int | None = None) -> DataFrame:
    """All features for every transaction in ``transactions``.

    Output: ``transaction_id, card_id, event_time, event_date`` (UTC) and ``FEATURE_COLUMNS``
    (numerics double, categoricals int). Rows near the start of the input see less history than
    they had in reality: callers load ``LOOKBACK_DAYS`` before the first date they keep, and pass
    as ``history`` transactions reaching ``label_match_days`` further back, where fraud reports
    find their merchant (default: ``transactions``). ``partitions``: of the per-key shuffles
    (default: the session's ``spark.sql.shuffle.partitions``).
    """
    tx = with_event_micros(transactions)
    past = with_event_micros(history) if history is not None else tx
    if partitions is None:
        partitions = int(tx.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    rows = apply_feature_kernel(tx, fraud_known_events(past, labels, params), partitions)
    return rows.select("transaction_id", "card_id", F.timestamp_micros(TS_US).alias("event_time"),
                       utc_date(F.col(TS_US)).alias("event_date"),
                       *fd.FEATURE_COLUMNS)


def labels_as_of(labels: DataFrame, cutoff: datetime) -> DataFrame:
    """``transaction_id, label``: the latest report made before ``cutoff`` decides (1 fraud, 0 cleared).

    Equal report times: a fraud report wins over a clearing one. Transactions without a report are
    absent here; the dataset builder labels them genuine once they are mature.
    """
    latest = F.max(F.struct("reported_at", "is_fraud"))
    return (labels.filter(F.col("reported_at") < F.lit(cutoff))
            .groupBy("transaction_id").agg(latest.alias("_latest"))
            .select("transaction_id", F.col("_latest.is_fraud").cast("int").alias("label")))


def first_fraud_reports(labels: DataFrame, cutoff: datetime) -> DataFrame:
    """``transaction_id, reported_at``: the earliest fraud report made before ``cutoff``.

    The evaluation protocol reads it to know since when a card was known to be compromised.
    """
    return (labels.filter(F.col("is_fraud") & (F.col("reported_at") < F.lit(cutoff)))
            .groupBy("transaction_id").agg(F.min("reported_at").alias(REPORTED_AT_COLUMN)))
