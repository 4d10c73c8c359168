"""Spark applies the feature kernel: hash-partition by key, sort by time, hand whole keys to numpy.

Two passes, each ``repartition(key) -> sortWithinPartitions(key, time) -> mapInArrow``:

1. merchant pass: one timeline per merchant holding its payments and the instants its frauds became
   known; emits each payment with the merchant features added;
2. card pass: each card's payments; emits the card, time and categorical features.

The Arrow column coding is :mod:`pipeline.features.arrow_kernel`'s (shared with the incremental
feature table, which runs the same kernel without Spark). Inside a task, Arrow batches are regrouped so that every kernel call sees complete keys
(:func:`complete_key_tables`): memory is bounded by ``max(KERNEL_ROWS, one key's history)``, so a
merchant with millions of payments is one large call, not a failure, and a partition of many small
keys is cut into calls of about ``KERNEL_ROWS`` rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import arrow_categorical_codes, value_codes
from pipeline.features.kernel import CardEvents, KeyedTimes, card_features, merchant_features, time_features

TS_US = "_ts_us"
IS_TX = "_is_tx"
KERNEL_ROWS = 500_000  # rows per kernel call when keys are small (a few hundred MB of numpy arrays)

# Every cell crosses the JVM <-> Python boundary twice per pass (Arrow conversion, row by row on the
# JVM side): the passes carry only what the kernel or the output needs. event_time is rebuilt from
# TS_US after the passes (same microseconds).
PASSTHROUGH = ("transaction_id", "card_id", "merchant_id", TS_US, "amount", "mcc", "channel", "country")
MERCHANT_COLUMNS = tuple(name for d in fd.MERCHANT_WINDOWS_DAYS for name in (fd.merchant_count(d), fd.merchant_fraud_rate(d)))
ROW_COLUMNS = ("amount", *fd.TIME_FEATURES)


def _ddl(columns: dict[str, str]) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in columns.items())


_PASSTHROUGH_DDL = {"transaction_id": "string", "card_id": "string", "merchant_id": "string", TS_US: "bigint",
                    "amount": "double", "mcc": "string", "channel": "string", "country": "string"}
MERCHANT_PASS_DDL = _ddl(_PASSTHROUGH_DDL | dict.fromkeys(MERCHANT_COLUMNS, "double"))
CARD_PASS_DDL = _ddl({"transaction_id": "string", "card_id": "string", TS_US: "bigint"}
                     | dict.fromkeys(fd.NUMERIC_FEATURES, "double") | dict.fromkeys(fd.CATEGORICAL_FEATURES, "int"))


def complete_key_tables(batches: Iterator[pa.RecordBatch], key: str, min_rows: int = KERNEL_ROWS) -> Iterator[pa.Table]:
    """Regroup a partition's batches (sorted by ``key``) into tables that each hold whole keys.

    A table is yielded once it has at least ``min_rows`` rows, cut before the last key seen (which
    may continue in the next batch); the rest is yielded at the end.
    """
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        rows += batch.num_rows
        if rows < min_rows:
            continue
        table = pa.Table.from_batches(pending)
        last = batch.column(key)[-1]
        tail = pc.sum(pc.equal(table.column(key), last)).as_py()  # sorted: the last key is a suffix
        if tail == rows:
            continue  # one key so far: keep reading its history
        yield table.slice(0, rows - tail)
        pending = table.slice(rows - tail).combine_chunks().to_batches()
        rows = tail
    if pending:
        yield pa.Table.from_batches(pending)


def _key_codes(column: pa.ChunkedArray) -> np.ndarray:
    """Dense codes of a key column sorted by key: 0 for the first key, +1 at each change."""
    values = column.combine_chunks()
    change = np.zeros(len(values), dtype=np.int64)
    if len(values) > 1:
        change[1:] = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1)).to_numpy(zero_copy_only=False)
    return np.cumsum(change)


def _int64(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64, copy=False)


def _merchant_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for table in complete_key_tables(batches, "merchant_id"):
        key = _key_codes(table.column("merchant_id"))
        ts = _int64(table, TS_US)
        is_tx = table.column(IS_TX).to_numpy(zero_copy_only=False).astype(bool)
        payments = KeyedTimes(key[is_tx], ts[is_tx])
        features = merchant_features(payments, KeyedTimes(key[~is_tx], ts[~is_tx]), payments)
        out = table.filter(pa.array(is_tx)).select(list(PASSTHROUGH))
        for name in MERCHANT_COLUMNS:
            out = out.append_column(name, pa.array(features[name], pa.float64()))
        yield from out.to_batches()


def _card_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for table in complete_key_tables(batches, "card_id"):
        ts = _int64(table, TS_US)
        amount = table.column("amount").to_numpy().astype(np.float64, copy=False)
        events = CardEvents(key=_key_codes(table.column("card_id")), ts_us=ts, amount=amount,
                            merchant=value_codes(table.column("merchant_id")),
                            country=value_codes(table.column("country")))
        features = card_features(events, events) | time_features(ts) | {"amount": amount}
        codes = arrow_categorical_codes(table)
        columns = {name: table.column(name) for name in ("transaction_id", "card_id", TS_US)}
        columns |= {name: pa.array(features[name], pa.float64()) if name in features else table.column(name)
                    for name in fd.NUMERIC_FEATURES}
        columns |= {name: pa.array(codes[name], pa.int32()) for name in fd.CATEGORICAL_FEATURES}
        yield from pa.table(columns).to_batches()


def apply_feature_kernel(tx: DataFrame, fraud_known: DataFrame, partitions: int) -> DataFrame:
    """Feature rows of ``tx`` (``PASSTHROUGH`` columns) given the merchant fraud-known instants
    (``merchant_id, _ts_us``): ``transaction_id, card_id, _ts_us`` and ``FEATURE_COLUMNS``."""
    payments = tx.select(*PASSTHROUGH).withColumn(IS_TX, F.lit(True))
    known = fraud_known.select("merchant_id", TS_US).withColumn(IS_TX, F.lit(False))
    timeline = payments.unionByName(known, allowMissingColumns=True)
    with_merchant = (timeline.repartition(partitions, "merchant_id")
                     .sortWithinPartitions("merchant_id", TS_US)
                     .mapInArrow(_merchant_batches, MERCHANT_PASS_DDL))
    return (with_merchant.repartition(partitions, "card_id")
            .sortWithinPartitions("card_id", TS_US)
            .mapInArrow(_card_batches, CARD_PASS_DDL))
