"""Ingest-only rejections: timing against the Kafka clock, and duplicates (within a run and
against what the raw store already holds).

These are decisions the contract cannot make from one record (``FUTURE_EVENT_TIME``,
``LATE_EVENT``, ``DUPLICATE``); they apply to records that passed contract validation, in that
order. All functions are pure DataFrame -> DataFrame.

Clock: the record's Kafka timestamp (when the producer created it, or when the broker appended
it). Using the run's wall clock instead would make a rerun of an old date reject everything.

Duplicates: the identity of a transaction is its ``transaction_id``; of a label, the triple
``(transaction_id, is_fraud, reported_at)`` (several reports for one transaction are legitimate:
a fraud report, then a clearing review). First arrival wins: a record whose identity the raw
store already holds is a duplicate; within one run, the copy with the smallest
``(Kafka timestamp, partition, offset)`` is kept and the others are duplicates.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipeline.contract import TIME_FIELD_BY_KIND, Kind, RejectReason
from pipeline.ingest.validate import FIELD, REASON

IDENTITY_BY_KIND: dict[Kind, tuple[str, ...]] = {
    Kind.TRANSACTION: ("transaction_id",),
    Kind.LABEL: ("transaction_id", "is_fraud", "reported_at"),
}


def _reject(df: DataFrame, condition, reason: RejectReason, field: str | None) -> DataFrame:
    hit = F.col(REASON).isNull() & F.coalesce(condition, F.lit(False))
    return (df.withColumn(FIELD, F.when(hit, F.lit(field)).otherwise(F.col(FIELD)))
            .withColumn(REASON, F.when(hit, F.lit(reason.value)).otherwise(F.col(REASON))))


def reject_bad_timing(df: DataFrame, kind: Kind, max_lateness_days: float, max_clock_skew_s: float) -> DataFrame:
    """Mark valid records whose event time is ahead of Kafka's clock by more than ``max_clock_skew_s``
    (``FUTURE_EVENT_TIME``) or behind it by more than ``max_lateness_days`` (``LATE_EVENT``).
    Records without a Kafka timestamp are not judged."""
    field = TIME_FIELD_BY_KIND[kind]
    ahead_s = F.unix_micros(F.col(field)) / 1e6 - F.unix_micros(F.col("timestamp")) / 1e6
    df = _reject(df, ahead_s > max_clock_skew_s, RejectReason.FUTURE_EVENT_TIME, field)
    return _reject(df, -ahead_s > max_lateness_days * 86_400, RejectReason.LATE_EVENT, field)


def reject_duplicates(df: DataFrame, kind: Kind, stored_identities: DataFrame) -> DataFrame:
    """Mark valid records as ``DUPLICATE`` if their identity is in ``stored_identities`` (columns
    ``IDENTITY_BY_KIND[kind]``) or a copy arrived earlier in ``df``."""
    keys = list(IDENTITY_BY_KIND[kind])
    stored = stored_identities.select(*keys).distinct().withColumn("_stored", F.lit(True))
    valid = F.col(REASON).isNull()
    # Rank valid rows only (partitioned by validity too): an invalid copy must not shadow a valid one.
    arrival = Window.partitionBy(valid, *keys).orderBy(
        F.col("timestamp").asc_nulls_last(), "topic", "partition", "offset")
    marked = df.join(stored, keys, "left").withColumn("_rank", F.when(valid, F.row_number().over(arrival)))
    marked = _reject(marked, F.col("_stored") | (F.col("_rank") > 1), RejectReason.DUPLICATE, keys[0])
    return marked.select(*df.columns)
