"""The feature kernel over Arrow tables in one process: no Spark, no per-key Python loop.

Two users: Spark's per-partition passes (:mod:`pipeline.features.spark_kernel` takes the column
coding helpers) and the incremental feature table (:mod:`pipeline.ingest.feature_update`), which
computes a few dates from their 30-day lookback read with pyarrow. Same kernel functions as the
Spark job and the scorer (:mod:`pipeline.features.kernel`), so the values agree bit for bit: every
value depends only on its key's events, never on how keys were grouped into calls.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.features import definitions as fd
from pipeline.features.kernel import (
    US_PER_DAY,
    CardEvents,
    KeyedTimes,
    card_features,
    categorical_codes,
    merchant_features,
    time_features,
)

# Columns a payment table must carry (raw-store names; event_time a UTC timestamp).
PAYMENT_COLUMNS = ("transaction_id", "card_id", "merchant_id", "event_time", "amount", "mcc", "channel", "country")
# What :func:`feature_rows` returns, in this order (what the dataset builder reads back).
ROW_SCHEMA = pa.schema(
    [("transaction_id", pa.string()), ("card_id", pa.string()), ("event_time", pa.timestamp("us", tz="UTC")),
     ("event_date", pa.date32())]
    + [(name, pa.float64()) for name in fd.NUMERIC_FEATURES]
    + [(name, pa.int32()) for name in fd.CATEGORICAL_FEATURES])


def value_codes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Non-negative integer codes of a column, consistent within one call (null: its own code)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    return pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False).astype(np.int64)


def arrow_categorical_codes(table: pa.Table) -> dict[str, np.ndarray]:
    """:func:`kernel.categorical_codes` of the table's raw categorical columns, hashing each distinct
    value once (Arrow's dictionary encoding; the rows never become Python strings). Null: as ``""``."""
    encoded = {raw: pc.dictionary_encode(table.column(raw).combine_chunks())
               for raw in set(fd.CATEGORICAL_SOURCES.values())}
    per_value = categorical_codes({raw: np.append(e.dictionary.to_numpy(zero_copy_only=False).astype(object), None)
                                   for raw, e in encoded.items()})  # index len(dictionary): null
    out = {}
    for column, raw in fd.CATEGORICAL_SOURCES.items():
        indices = pc.fill_null(encoded[raw].indices, len(encoded[raw].dictionary))
        out[column] = per_value[column][indices.to_numpy(zero_copy_only=False)]
    return out


def epoch_us(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A timestamp column as int64 epoch microseconds."""
    return pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy(zero_copy_only=False)


def _card_columns(tx: pa.Table, ts: np.ndarray, wanted: np.ndarray) -> dict[str, np.ndarray]:
    """Card window features of the ``wanted`` rows, every row of ``tx`` as history."""
    key = value_codes(tx.column("card_id"))
    order = np.lexsort((ts, key))  # history sorted by (card, time), as the kernel requires
    amount = tx.column("amount").to_numpy().astype(np.float64, copy=False)
    merchant, country = value_codes(tx.column("merchant_id")), value_codes(tx.column("country"))
    history = CardEvents(key[order], ts[order], amount[order], merchant[order], country[order])
    queries = CardEvents(key[wanted], ts[wanted], amount[wanted], merchant[wanted], country[wanted])
    return card_features(history, queries)


def _merchant_columns(tx: pa.Table, ts: np.ndarray, known: pa.Table, wanted: np.ndarray) -> dict[str, np.ndarray]:
    """Merchant counts and fraud rates of the ``wanted`` rows; ``known``: ``merchant_id, ts_us``."""
    codes = value_codes(pa.concat_arrays([tx.column("merchant_id").combine_chunks(),
                                          known.column("merchant_id").combine_chunks().cast(pa.string())]))
    tx_key, fraud_key = codes[:tx.num_rows], codes[tx.num_rows:]
    fraud_ts = known.column("ts_us").to_numpy(zero_copy_only=False).astype(np.int64)
    tx_order, fraud_order = np.lexsort((ts, tx_key)), np.lexsort((fraud_ts, fraud_key))
    payments = KeyedTimes(tx_key[tx_order], ts[tx_order])
    fraud = KeyedTimes(fraud_key[fraud_order], fraud_ts[fraud_order])
    return merchant_features(payments, fraud, KeyedTimes(tx_key[wanted], ts[wanted]))


def feature_rows(tx: pa.Table, fraud_known: pa.Table, wanted: np.ndarray) -> pa.Table:
    """Feature rows (:data:`ROW_SCHEMA`) of the rows of ``tx`` selected by the index array ``wanted``.

    ``tx``: payments (:data:`PAYMENT_COLUMNS`) holding every payment of the wanted rows' cards and
    merchants in the 30 days before them; ``fraud_known``: ``merchant_id, ts_us``, the instants
    frauds became usable, covering the same windows. Rows are returned in ``wanted``'s order.
    """
    ts = epoch_us(tx.column("event_time"))
    columns = _card_columns(tx, ts, wanted) | _merchant_columns(tx, ts, fraud_known, wanted)
    picked = tx.take(pa.array(wanted, pa.int64()))
    columns |= time_features(ts[wanted]) | {"amount": picked.column("amount").to_numpy().astype(np.float64)}
    codes = arrow_categorical_codes(picked)
    days = np.floor_divide(ts[wanted], US_PER_DAY).astype(np.int32)
    arrays = [picked.column("transaction_id"), picked.column("card_id"),
              pa.array(ts[wanted], pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array(days, pa.int32()).cast(pa.date32())]
    arrays += [pa.array(columns[name], pa.float64()) for name in fd.NUMERIC_FEATURES]
    arrays += [pa.array(codes[name], pa.int32()) for name in fd.CATEGORICAL_FEATURES]
    return pa.Table.from_arrays(arrays, schema=ROW_SCHEMA)
