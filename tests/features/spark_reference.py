"""Reference only: feature version 1 as Spark column expressions (the pre-kernel implementation).

Kept so a test can compare the kernel with an independent implementation on random data; the
pipeline never imports it. It covers the version-1 features (the kernel's later additions are
tested against a brute-force reading in ``test_kernel``). Inputs are raw-store frames:

* transactions: ``transaction_id, card_id, merchant_id, event_time (timestamp), amount (double),
  mcc, channel, country`` (transaction_id unique: the raw store is de-duplicated);
* labels: ``transaction_id, is_fraud (boolean), reported_at (timestamp)``.

Windows are Spark range frames over event time in microseconds, ``rangeBetween(-window, -1)``:
exactly the half-open ``[t - window, t)`` of :mod:`pipeline.features.definitions`. Sums of
amounts run over integer cents (long / decimal), never doubles, so the result does not depend on
the order rows reach a window and reruns produce identical bits.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipeline.features import definitions as fd
from pipeline.features.params import FeatureParams
from pipeline.features.transforms import fraud_known_events

US_PER_SECOND = 1_000_000
US_PER_DAY = fd.DAY_SECONDS * US_PER_SECOND
# Amounts above this are clamped before the cents arithmetic (a contract-valid 1e300 would
# overflow a long); the raw ``amount`` feature keeps the value as sent.
MAX_AMOUNT_FOR_SUMS = (2**31 - 1) / 100  # the kernel's clamp (feature version 2)

TS_US = "_ts_us"
CENTS = "_cents"
V1_NUMERIC_FEATURES = (
    "amount",
    *(name for d in fd.CARD_WINDOWS_DAYS for name in (fd.card_count(d), fd.card_mean(d), fd.card_std(d))),
    fd.CARD_SECONDS_SINCE_PREV, fd.CARD_AMOUNT_TO_MEAN_30D, fd.CARD_DISTINCT_MERCHANTS_1D,
    *(fd.merchant_count(d) for d in fd.MERCHANT_WINDOWS_DAYS),
    *(fd.merchant_fraud_rate(d) for d in fd.MERCHANT_WINDOWS_DAYS),
    *fd.TIME_FEATURES,
)
V1_FEATURE_COLUMNS = V1_NUMERIC_FEATURES + tuple(fd.CATEGORICAL_FEATURES)


def utc_date(ts_us: Column) -> Column:
    """UTC calendar date of epoch microseconds, independent of the session time zone."""
    return F.date_from_unix_date(F.floor(ts_us / US_PER_DAY).cast("int"))


def with_event_micros(transactions: DataFrame) -> DataFrame:
    """Add the event time as epoch microseconds and the amount as integer cents."""
    clamped = F.least(F.col("amount"), F.lit(MAX_AMOUNT_FOR_SUMS))
    return (transactions
            .withColumn(TS_US, F.unix_micros("event_time"))
            .withColumn(CENTS, F.round(clamped * 100).cast("long")))


def _window(key: str, days: int):
    return Window.partitionBy(key).orderBy(TS_US).rangeBetween(-days * US_PER_DAY, -1)


def card_window_features(tx: DataFrame) -> DataFrame:
    """Per-card count / mean / std of amount over 1, 7, 30 days, recency, ratio, distinct merchants.

    Needs ``with_event_micros`` columns. Fills: mean 0 and std 0 without enough history.
    """
    out = tx
    cents_sq = F.col(CENTS).cast("decimal(20,0)") * F.col(CENTS).cast("decimal(20,0)")
    for days in fd.CARD_WINDOWS_DAYS:
        w = _window("card_id", days)
        n = F.count(F.lit(1)).over(w)
        total = F.sum(CENTS).over(w).cast("double")
        total_sq = F.sum(cents_sq).over(w).cast("double")
        out = out.withColumn(fd.card_count(days), n.cast("double"))
        out = out.withColumn(fd.card_mean(days), F.when(n > 0, total / n / 100).otherwise(0.0))
        variance = (total_sq - total * total / n) / (n - 1)
        out = out.withColumn(fd.card_std(days),
                             F.when(n > 1, F.sqrt(F.greatest(variance, F.lit(0.0))) / 100).otherwise(0.0))
    lookback = _window("card_id", fd.LOOKBACK_DAYS)
    previous = F.max(TS_US).over(lookback)
    out = out.withColumn(fd.CARD_SECONDS_SINCE_PREV,
                         F.coalesce((F.col(TS_US) - previous) / US_PER_SECOND, F.lit(fd.NO_PREVIOUS_SECONDS)))
    mean30 = F.col(fd.card_mean(30))
    out = out.withColumn(fd.CARD_AMOUNT_TO_MEAN_30D,
                         F.when(mean30 > 0, F.col("amount") / mean30).otherwise(fd.NO_HISTORY_AMOUNT_RATIO))
    merchants_1d = F.size(F.collect_set("merchant_id").over(_window("card_id", 1)))
    return out.withColumn(fd.CARD_DISTINCT_MERCHANTS_1D, merchants_1d.cast("double"))


def merchant_window_features(tx: DataFrame, fraud_events: DataFrame) -> DataFrame:
    """Per-merchant transaction counts and known-fraud rates over 1, 7, 30 days.

    One timeline per merchant holds its transactions and its ``fraud_events``; a window sums both.
    Rate = frauds that became known in ``[t - w, t)`` / transactions in ``[t - w, t)`` (at least 1),
    capped at 1.
    """
    timeline = (tx.withColumn("_is_tx", F.lit(1)).withColumn("_fraud", F.lit(0))
                .unionByName(fraud_events.withColumn("_is_tx", F.lit(0)).withColumn("_fraud", F.lit(1)),
                             allowMissingColumns=True))
    for days in fd.MERCHANT_WINDOWS_DAYS:
        w = _window("merchant_id", days)
        count = F.sum("_is_tx").over(w)
        frauds = F.sum("_fraud").over(w)
        timeline = timeline.withColumn(fd.merchant_count(days), F.coalesce(count, F.lit(0)).cast("double"))
        rate = F.least(F.coalesce(frauds, F.lit(0)) / F.greatest(count, F.lit(1)), F.lit(1.0))
        timeline = timeline.withColumn(fd.merchant_fraud_rate(days), F.coalesce(rate, F.lit(0.0)).cast("double"))
    return timeline.filter(F.col("_is_tx") == 1).drop("_is_tx", "_fraud")


def time_features(tx: DataFrame) -> DataFrame:
    """UTC hour, weekday (0 = Monday), night (hour < 6) and weekend flags, as doubles."""
    hour = F.pmod(F.floor(F.col(TS_US) / (3600 * US_PER_SECOND)), 24)
    # 1970-01-01 was a Thursday (weekday 3).
    weekday = F.pmod(F.floor(F.col(TS_US) / US_PER_DAY) + 3, 7)
    return (tx.withColumn("hour", hour.cast("double"))
            .withColumn("weekday", weekday.cast("double"))
            .withColumn("is_night", (hour < fd.NIGHT_END_HOUR).cast("double"))
            .withColumn("is_weekend", (weekday >= 5).cast("double")))


def categorical_code_column(value: Column, buckets: int) -> Column:
    """Spark twin of :func:`pipeline.features.definitions.categorical_code`."""
    hashed = F.lit(1) + F.pmod(F.crc32(value.cast("binary")), F.lit(buckets - 1))
    return F.when(value.isNull() | (value == ""), F.lit(0)).otherwise(hashed).cast("int")


def categorical_codes(tx: DataFrame) -> DataFrame:
    """mcc / channel / country as hashed integer codes (0 = absent)."""
    for column, buckets in fd.CATEGORICAL_FEATURES.items():
        tx = tx.withColumn(column, categorical_code_column(F.col(fd.CATEGORICAL_SOURCES[column]), buckets))
    return tx


def build_features(transactions: DataFrame, labels: DataFrame, params: FeatureParams,
                   history: DataFrame | None = None) -> DataFrame:
    """All features for every transaction in ``transactions``.

    Output: ``transaction_id, card_id, event_time, event_date`` (UTC) and ``FEATURE_COLUMNS``
    (numerics double, categoricals int). Rows near the start of the input see less history than
    they had in reality: callers load ``LOOKBACK_DAYS`` before the first date they keep, and pass
    as ``history`` transactions reaching ``label_match_days`` further back, where fraud reports
    find their merchant (default: ``transactions``).
    """
    tx = with_event_micros(transactions)
    past = with_event_micros(history) if history is not None else tx
    tx = card_window_features(tx)
    tx = merchant_window_features(tx, fraud_known_events(past, labels, params))
    tx = categorical_codes(time_features(tx))
    tx = tx.withColumn("amount", F.col("amount").cast("double"))
    return tx.select("transaction_id", "card_id", "event_time", utc_date(F.col(TS_US)).alias("event_date"),
                     *V1_FEATURE_COLUMNS)
