"""The feature kernel over Arrow tables in one process: no Spark, no per-key Python loop.

Two users: Spark's per-partition passes (:mod:`pipeline.features.spark_kernel` takes the column
coding helpers) and the incremental feature table (:mod:`pipeline.ingest.feature_update`), which
computes a few dates from their 30-day lookback with the ids already coded (:class:`CodedPayments`),
sorted per key (:class:`SortedPayments`: a night merges its new date into the sort it carried from
the night before, :func:`merge_sorted`, instead of sorting 31 days again).
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


@dataclass(frozen=True)
class SortedPayments:
    """Payments in the two orders the kernel's passes read: ``by_card`` sorted by (card, time), and
    ``by_merchant``, the same payments' (merchant, time), sorted by (merchant, time). Payments of
    one key at one instant come in any order: no kernel value depends on it."""

    by_card: CodedPayments
    by_merchant: KeyedTimes

    def __len__(self) -> int:
        return len(self.by_card.ts_us)

    def since(self, start_us: int) -> SortedPayments:
        """The payments at or after ``start_us``, in the same orders."""
        card, merchant = self.by_card.ts_us >= start_us, self.by_merchant.ts_us >= start_us
        if card.all():
            return self
        return SortedPayments(_take_payments(self.by_card, card),
                              KeyedTimes(self.by_merchant.key[merchant], self.by_merchant.ts_us[merchant]))


def _take_payments(p: CodedPayments, rows: np.ndarray) -> CodedPayments:
    return CodedPayments(p.card[rows], p.merchant[rows], p.country[rows], p.ts_us[rows], p.amount[rows])


def sort_payments(payments: CodedPayments) -> SortedPayments:
    """``payments`` in the kernel's two orders (:func:`key_time_order` each)."""
    p = payments
    by_merchant = key_time_order(p.merchant, p.ts_us)
    return SortedPayments(_take_payments(p, key_time_order(p.card, p.ts_us)),
                          KeyedTimes(p.merchant[by_merchant], p.ts_us[by_merchant]))


def merge_sorted(old: SortedPayments, new: SortedPayments, start_us: int | None = None) -> SortedPayments:
    """``new`` merged into ``old``'s payments at or after ``start_us`` (all of them: None), in the
    kernel's orders: ``old.since(start_us)`` with ``new`` inserted, where sorting both would sort
    them all. One binary search per new payment, and per column one copy of the old payments kept,
    the cut made on the way (a night's carried 30 days, 0.6M payments, and its new day: 31 ms,
    where cutting them first and then merging took 38)."""
    fields = ("card", "ts_us", "merchant", "country", "amount")  # key and time first: they place the rows
    by_card = _merged_columns([getattr(old.by_card, f) for f in fields], [getattr(new.by_card, f) for f in fields],
                              start_us)
    by_merchant = _merged_columns([old.by_merchant.key, old.by_merchant.ts_us],
                                  [new.by_merchant.key, new.by_merchant.ts_us], start_us)
    return SortedPayments(CodedPayments(**dict(zip(fields, by_card, strict=True))), KeyedTimes(*by_merchant))


def _merged_columns(old: list[np.ndarray], new: list[np.ndarray], start_us: int | None) -> list[np.ndarray]:
    """Columns of rows sorted by (key, time) (the first two columns), ``new``'s rows placed among
    ``old``'s at or after ``start_us`` as :func:`_merge_positions` places them."""
    if start_us is not None:
        keep = old[1] >= start_us
        if not keep.all():
            old = [column[keep] for column in old]
    at = _merge_positions(old[0], old[1], new[0], new[1])
    new_rows = at + np.arange(len(at))  # each new row moves past the new rows before it
    old_rows = np.ones(len(old[0]) + len(at), dtype=bool)
    old_rows[new_rows] = False
    out = []
    for old_column, new_column in zip(old, new, strict=True):
        merged = np.empty(len(old_rows), dtype=old_column.dtype)
        merged[old_rows] = old_column
        merged[new_rows] = new_column
        out.append(merged)
    return out


def _merge_positions(key: np.ndarray, ts: np.ndarray, new_key: np.ndarray, new_ts: np.ndarray) -> np.ndarray:
    """Where each row of the (key, ts)-sorted ``new_*`` goes among the (key, ts)-sorted ``key, ts``
    (``np.insert`` indices, in order): after the rows it does not precede."""
    if not len(key) or not len(new_key):
        return np.full(len(new_key), len(key), dtype=np.int64)
    origin = min(int(ts.min()), int(new_ts.min()))
    span = max(int(ts.max()), int(new_ts.max())) - origin + 1
    if (max(int(key.max()), int(new_key.max())) + 1) * span < 2**63:  # one int64 axis: key, then time
        return np.searchsorted(key * span + (ts - origin), new_key * span + (new_ts - origin), side="right")
    merged = np.lexsort((np.concatenate([ts, new_ts]), np.concatenate([key, new_key])))  # rare: codes past ~2^21
    return np.flatnonzero(merged >= len(key)) - np.arange(len(new_key))  # stable: old rows first among equals


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


def _card_columns(history: CodedPayments, queries: CodedPayments) -> dict[str, np.ndarray]:
    """Card window features of ``queries``, every row of ``history`` (sorted by card, then time) as history."""
    h = history
    # Only the queried cards' payments can fall in their windows: a night queries one day, whose
    # cards hold ~80% of a 31-day history's rows in the benchmark (fewer where cards pay rarely).
    queried = np.zeros(max(int(h.card.max(initial=0)), int(queries.card.max(initial=0))) + 1, dtype=bool)
    queried[queries.card] = True
    keep = queried[h.card]
    events = CardEvents(h.card[keep], h.ts_us[keep], h.amount[keep], h.merchant[keep], h.country[keep])
    query_order = key_time_order(queries.card, queries.ts_us)
    q = _take_payments(queries, query_order)
    in_order = CardEvents(q.card, q.ts_us, q.amount, q.merchant, q.country)
    return _in_query_order(card_features(events, in_order, _pair_histories(events, in_order)), query_order)


def _pair_histories(events: CardEvents, queries: CardEvents) -> PairHistories:
    """The parts of ``events`` (sorted by card, then time) the per-pair features of ``queries`` can
    count (:class:`kernel.PairHistories`). One day of queries against 31 days of history: about a
    tenth of the events for merchant pairs, a fifteenth for the last day. (Country counts need no
    cut: they search each query's lookback range by country, see ``kernel._ValueAxis``.)"""
    radix = int(max(events.merchant.max(initial=0), queries.merchant.max(initial=0))) + 1
    # Arrow's hash set: one probe per event, where numpy's isin sorts them all.
    member = pc.is_in(pa.array(events.key * radix + events.merchant),
                      value_set=pa.array(queries.key * radix + queries.merchant))
    first = int(queries.ts_us.min()) if len(queries) else 0
    return PairHistories(merchant=_take(events, np.flatnonzero(member.to_numpy(zero_copy_only=False))),
                         recent=_take(events, np.flatnonzero(events.ts_us >= first - US_PER_DAY)))


def _take(events: CardEvents, rows: np.ndarray) -> CardEvents:
    return CardEvents(events.key[rows], events.ts_us[rows], events.amount[rows], events.merchant[rows],
                      events.country[rows])


def _merchant_columns(history: KeyedTimes, fraud_known: KeyedTimes, queries: CodedPayments) -> dict[str, np.ndarray]:
    """Merchant counts and fraud rates of ``queries``, ``history``: payments sorted by (merchant, time)."""
    fraud_order = key_time_order(fraud_known.key, fraud_known.ts_us)
    known = KeyedTimes(fraud_known.key[fraud_order], fraud_known.ts_us[fraud_order])
    query_order = key_time_order(queries.merchant, queries.ts_us)
    in_order = KeyedTimes(queries.merchant[query_order], queries.ts_us[query_order])
    return _in_query_order(merchant_features(history, known, in_order), query_order)


def feature_rows(history: CodedPayments, fraud_known: KeyedTimes, wanted: np.ndarray, rows: pa.Table) -> pa.Table:
    """Feature rows (:data:`ROW_SCHEMA`) of the payments ``rows`` (:data:`PAYMENT_COLUMNS`), which are
    the rows of ``history`` at the indices ``wanted``, in that order.

    ``history`` holds every payment of the wanted rows' cards and merchants in the 30 days before
    them; ``fraud_known``: per merchant (coded as in ``history``), the instants frauds became
    usable, covering the same windows, in any order. Rows are returned in ``wanted``'s order.
    """
    return sorted_feature_rows(sort_payments(history), fraud_known, _take_payments(history, wanted), rows)


def sorted_feature_rows(history: SortedPayments, fraud_known: KeyedTimes, queries: CodedPayments,
                        rows: pa.Table) -> pa.Table:
    """:func:`feature_rows` of ``queries`` (the payments of ``rows``, in that order, coded as
    ``history`` codes them), whose payments ``history`` holds, already sorted."""
    ts = queries.ts_us
    columns = _card_columns(history.by_card, queries) | _merchant_columns(history.by_merchant, fraud_known, queries)
    columns |= time_features(ts) | {"amount": queries.amount}
    codes = arrow_categorical_codes(rows)
    days = np.floor_divide(ts, US_PER_DAY).astype(np.int32)
    arrays = [rows.column("transaction_id"), rows.column("card_id"),
              pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")), pa.array(days, pa.int32()).cast(pa.date32())]
    arrays += [pa.array(columns[name], pa.float64()) for name in fd.NUMERIC_FEATURES]
    arrays += [pa.array(codes[name], pa.int32()) for name in fd.CATEGORICAL_FEATURES]
    return pa.Table.from_arrays(arrays, schema=ROW_SCHEMA)
