"""The feature kernel over Arrow tables in one process: no Spark, no per-key Python loop.

Two users: Spark's per-partition passes (:mod:`pipeline.features.spark_kernel` takes the column
coding helpers) and the incremental feature table (:mod:`pipeline.ingest.feature_update`), which
computes a few dates from their 30-day lookback with the ids already coded (:class:`CodedPayments`).
Same kernel functions as the Spark job and the scorer (:mod:`pipeline.features.kernel`), so the
values agree bit for bit: every value depends only on its key's events, never on how keys were
grouped into calls or which integers code them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.features import definitions as fd
from pipeline.features.kernel import (
    US_PER_DAY,
    CardEvents,
    KeyedTimes,
    PairHistories,
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


@dataclass(frozen=True)
class CodedPayments:
    """Payments as the window kernel reads them. Ids are non-negative integer codes, any coding
    consistent across the arrays (the lookback cache's vocabulary: :mod:`pipeline.datasets.id_vocabulary`);
    ``ts_us``: epoch microseconds; ``amount``: float64. All int64 but ``amount``."""

    card: np.ndarray
    merchant: np.ndarray
    country: np.ndarray
    ts_us: np.ndarray
    amount: np.ndarray


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


def key_time_order(key: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Indices that sort rows by ``(key, ts)``. Rows already in time order with keys under 2^16 (the
    feature table's: dates coded in time order, ids by a vocabulary) take a stable radix sort of
    the keys, linear; others one sort of ``key * span + time`` where that fits in int64, else a
    lexsort. Rows with the same key and instant come in any order: no kernel value depends on it
    (same-instant events never see each other)."""
    if not len(ts):
        return np.zeros(0, dtype=np.int64)
    if int(key.max()) < 2**16 and bool(np.all(ts[1:] >= ts[:-1])):
        return np.argsort(key.astype(np.uint16), kind="stable")
    origin = int(ts.min())
    span = int(ts.max()) - origin + 1
    if (int(key.max()) + 1) * span >= 2**63:
        return np.lexsort((ts, key))
    return np.argsort(key * span + (ts - origin))


def _in_query_order(features: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """Features computed for the queries taken in ``order``, put back in the queries' own order."""
    out = {}
    for name, values in features.items():
        out[name] = np.empty_like(values)
        out[name][order] = values
    return out


# Both passes below hand the kernel their queries sorted like the history: a query's window bounds
# then come in ascending order, and numpy's searchsorted starts each search from the previous hit
# instead of from the whole history (several times faster than the wanted rows' time order).


def _card_columns(history: CodedPayments, wanted: np.ndarray) -> dict[str, np.ndarray]:
    """Card window features of the ``wanted`` rows, every row of ``history`` as history."""
    h = history
    # Only the queried cards' payments can fall in their windows: a night queries one day, whose
    # cards hold ~80% of a 31-day history's rows in the benchmark (fewer where cards pay rarely).
    queried = np.zeros(int(h.card.max(initial=0)) + 1, dtype=bool)
    queried[h.card[wanted]] = True
    rows = np.flatnonzero(queried[h.card])
    order = rows[key_time_order(h.card[rows], h.ts_us[rows])]  # sorted by (card, time), as the kernel requires
    events = CardEvents(h.card[order], h.ts_us[order], h.amount[order], h.merchant[order], h.country[order])
    query_order = key_time_order(h.card[wanted], h.ts_us[wanted])
    q = wanted[query_order]
    queries = CardEvents(h.card[q], h.ts_us[q], h.amount[q], h.merchant[q], h.country[q])
    return _in_query_order(card_features(events, queries, _pair_histories(events, queries)), query_order)


def _pair_histories(events: CardEvents, queries: CardEvents) -> PairHistories:
    """The parts of ``events`` (sorted by card, then time) the per-pair features of ``queries`` can
    count (:class:`kernel.PairHistories`). One day of queries against 31 days of history: about a
    tenth of the events for merchant pairs, a fifteenth for the last day. Country pairs keep every
    event: a card pays mostly in one country, so the cut would cost about what it saves."""
    radix = int(max(events.merchant.max(initial=0), queries.merchant.max(initial=0))) + 1
    # Arrow's hash set: one probe per event, where numpy's isin sorts them all.
    member = pc.is_in(pa.array(events.key * radix + events.merchant),
                      value_set=pa.array(queries.key * radix + queries.merchant))
    first = int(queries.ts_us.min()) if len(queries) else 0
    return PairHistories(merchant=_take(events, np.flatnonzero(member.to_numpy(zero_copy_only=False))),
                         country=events, recent=_take(events, np.flatnonzero(events.ts_us >= first - US_PER_DAY)))


def _take(events: CardEvents, rows: np.ndarray) -> CardEvents:
    return CardEvents(events.key[rows], events.ts_us[rows], events.amount[rows], events.merchant[rows],
                      events.country[rows])


def _merchant_columns(history: CodedPayments, fraud_known: KeyedTimes, wanted: np.ndarray) -> dict[str, np.ndarray]:
    """Merchant counts and fraud rates of the ``wanted`` rows."""
    h, fraud = history, fraud_known
    tx_order, fraud_order = key_time_order(h.merchant, h.ts_us), key_time_order(fraud.key, fraud.ts_us)
    payments = KeyedTimes(h.merchant[tx_order], h.ts_us[tx_order])
    known = KeyedTimes(fraud.key[fraud_order], fraud.ts_us[fraud_order])
    query_order = key_time_order(h.merchant[wanted], h.ts_us[wanted])
    q = wanted[query_order]
    return _in_query_order(merchant_features(payments, known, KeyedTimes(h.merchant[q], h.ts_us[q])), query_order)


def feature_rows(history: CodedPayments, fraud_known: KeyedTimes, wanted: np.ndarray, rows: pa.Table) -> pa.Table:
    """Feature rows (:data:`ROW_SCHEMA`) of the payments ``rows`` (:data:`PAYMENT_COLUMNS`), which are
    the rows of ``history`` at the indices ``wanted``, in that order.

    ``history`` holds every payment of the wanted rows' cards and merchants in the 30 days before
    them; ``fraud_known``: per merchant (coded as in ``history``), the instants frauds became
    usable, covering the same windows, in any order. Rows are returned in ``wanted``'s order.
    """
    ts = history.ts_us[wanted]
    columns = _card_columns(history, wanted) | _merchant_columns(history, fraud_known, wanted)
    columns |= time_features(ts) | {"amount": history.amount[wanted]}
    codes = arrow_categorical_codes(rows)
    days = np.floor_divide(ts, US_PER_DAY).astype(np.int32)
    arrays = [rows.column("transaction_id"), rows.column("card_id"),
              pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array(days, pa.int32()).cast(pa.date32())]
    arrays += [pa.array(columns[name], pa.float64()) for name in fd.NUMERIC_FEATURES]
    arrays += [pa.array(codes[name], pa.int32()) for name in fd.CATEGORICAL_FEATURES]
    return pa.Table.from_arrays(arrays, schema=ROW_SCHEMA)
