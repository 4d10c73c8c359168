"""Spark applies the feature kernel: hash-partition by key, sort by time, hand whole keys to numpy.

Two passes, each ``repartition(key, chunk) -> sortWithinPartitions(key, chunk, time) -> mapInArrow``:

1. merchant pass: one timeline per merchant holding its payments and the instants its frauds became
   known; emits each queried payment with the merchant features added;
2. card pass: each card's payments; emits the queried payments with the card, time and categorical
   features.

Every payment handed in as ``tx`` is a query (gets a feature row); payments handed in as ``history``
are only counted in the windows of others (the nightly feature table's 30-day lookback), and travel
slim: the columns their pass's kernel reads, nothing else.

The Arrow column coding is :mod:`pipeline.features.arrow_kernel`'s (shared with the incremental
feature table, which runs the same kernel without Spark). Inside a task, Arrow batches are regrouped
so that every kernel call sees complete groups (:func:`complete_key_tables`): memory is bounded by
``max(kernel_rows, one group)``. A group is a key, or with ``hot_key_rows`` set, a chunk of a hot
key (:func:`split_hot_keys`): a key queried more than ``hot_key_rows`` times is cut into time
chunks of about that many queries, each chunk a group of its own that also receives the key's
payments (and known frauds) of the ``LOOKBACK_DAYS`` before it, slim, as context it does not emit.
A chunk's task then holds at most ~``hot_key_rows`` full rows of the key plus the key's lookback in
those few columns, instead of the key's whole history of full rows; the values are unchanged, since
every window a query reads lies inside its chunk's context.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator
from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import arrow_categorical_codes, value_codes
from pipeline.features.kernel import (
    US_PER_DAY,
    CardEvents,
    KeyedTimes,
    card_features,
    merchant_features,
    time_features,
)

TS_US = "_ts_us"
IS_TX = "_is_tx"
QUERY = "_query"  # the row gets a feature row from this pass (else: history, or a hot chunk's context)
CHUNK = "_chunk"  # which time chunk of its key the row is in (0 unless the key is hot)
KERNEL_ROWS = 500_000  # rows per kernel call when keys are small (a few hundred MB of numpy arrays)
HOT_KEY_BUCKET_US = 3600 * 1_000_000  # a hot key is cut between hours: its chunks hold whole hours

# Every cell crosses the JVM <-> Python boundary twice per pass (Arrow conversion, row by row on the
# JVM side): the passes carry only what the kernel or the output needs. event_time is rebuilt from
# TS_US after the passes (same microseconds).
PASSTHROUGH = ("transaction_id", "card_id", "merchant_id", TS_US, "amount", "mcc", "channel", "country")
MERCHANT_HISTORY = ("merchant_id", TS_US)  # what the merchant pass reads of a history payment
CARD_HISTORY = ("card_id", TS_US, "amount", "merchant_id", "country")  # ... and the card pass
MERCHANT_COLUMNS = tuple(name for d in fd.MERCHANT_WINDOWS_DAYS for name in (fd.merchant_count(d), fd.merchant_fraud_rate(d)))
ROW_COLUMNS = ("amount", *fd.TIME_FEATURES)


def _ddl(columns: dict[str, str]) -> str:
    return ", ".join(f"`{name}` {kind}" for name, kind in columns.items())


_PASSTHROUGH_DDL = {"transaction_id": "string", "card_id": "string", "merchant_id": "string", TS_US: "bigint",
                    "amount": "double", "mcc": "string", "channel": "string", "country": "string"}
_MERCHANT_PASS = _PASSTHROUGH_DDL | dict.fromkeys(MERCHANT_COLUMNS, "double")
_CARD_PASS = ({"transaction_id": "string", "card_id": "string", TS_US: "bigint"}
              | dict.fromkeys(fd.NUMERIC_FEATURES, "double") | dict.fromkeys(fd.CATEGORICAL_FEATURES, "int"))
MERCHANT_PASS_DDL = _ddl(_MERCHANT_PASS)
CARD_PASS_DDL = _ddl(_CARD_PASS)


class KernelCallStats(AccumulatorParam):
    """Accumulates, per pass, ``[kernel calls, rows, groups, most rows of one group in one call]``
    (a Spark accumulator: :func:`apply_feature_kernel`'s ``stats``; a group is a key or a hot key's
    chunk): what bounds a task's memory."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, total: dict, more: dict) -> dict:
        for name, (calls, rows, groups, largest) in more.items():
            seen = total.setdefault(name, [0, 0, 0, 0])
            seen[:] = [seen[0] + calls, seen[1] + rows, seen[2] + groups, max(seen[3], largest)]
        return total


def complete_key_tables(batches: Iterator[pa.RecordBatch], keys: Sequence[str],
                        min_rows: int = KERNEL_ROWS) -> Iterator[pa.Table]:
    """Regroup a partition's batches (sorted by ``keys``) into tables that each hold whole groups.

    A table is yielded once it has at least ``min_rows`` rows, cut before the last group seen (which
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
        last = [pc.equal(table.column(k), batch.column(k)[-1]) for k in keys]
        tail = pc.sum(last[0] if len(last) == 1 else pc.and_(*last)).as_py()  # sorted: the last group is a suffix
        if tail == rows:
            continue  # one group so far: keep reading its history
        yield table.slice(0, rows - tail)
        pending = table.slice(rows - tail).combine_chunks().to_batches()
        rows = tail
    if pending:
        yield pa.Table.from_batches(pending)


def _key_codes(table: pa.Table, keys: Sequence[str]) -> np.ndarray:
    """Dense codes of the groups of a table sorted by ``keys``: 0 for the first, +1 at each change."""
    change = np.zeros(table.num_rows, dtype=bool)
    if table.num_rows > 1:
        for k in keys:
            values = table.column(k).combine_chunks()
            change[1:] |= pc.not_equal(values.slice(1), values.slice(0, len(values) - 1)).to_numpy(zero_copy_only=False)
    return np.cumsum(change, dtype=np.int64)


def _int64(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().astype(np.int64, copy=False)


def _flags(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False).astype(bool)


def _count_call(stats: Accumulator | None, name: str, key: np.ndarray) -> None:
    if stats is not None and len(key):
        sizes = np.bincount(key)
        stats.add({name: [1, len(key), len(sizes), int(sizes.max())]})


def _keyed_tables(batches: Iterator[pa.RecordBatch], key_column: str, kernel_rows: int, stats: Accumulator | None,
                  pass_name: str) -> Iterator[tuple[pa.Table, np.ndarray, np.ndarray]]:
    """One pass's kernel calls: each table of whole (``key_column``, hot-key chunk) groups, with its key
    codes and event times; each call counted under ``pass_name``."""
    keys = (key_column, CHUNK)
    for table in complete_key_tables(batches, keys, kernel_rows):
        key = _key_codes(table, keys)
        _count_call(stats, pass_name, key)
        yield table, key, _int64(table, TS_US)


def _merchant_batches(batches: Iterator[pa.RecordBatch], carry: tuple[str, ...], kernel_rows: int,
                      stats: Accumulator | None) -> Iterator[pa.RecordBatch]:
    for table, key, ts in _keyed_tables(batches, "merchant_id", kernel_rows, stats, "merchant"):
        is_tx, query = _flags(table, IS_TX), _flags(table, QUERY)
        payments = KeyedTimes(key[is_tx], ts[is_tx])
        queries = payments if query.sum() == is_tx.sum() else KeyedTimes(key[query], ts[query])
        features = merchant_features(payments, KeyedTimes(key[~is_tx], ts[~is_tx]), queries)
        rows = table.filter(pa.array(query))
        columns = {name: rows.column(name) for name in PASSTHROUGH}
        columns |= {name: pa.array(features[name], pa.float64()) for name in MERCHANT_COLUMNS}
        columns |= {name: rows.column(name) for name in carry}  # last, as the pass's DDL declares them
        yield from pa.table(columns).to_batches()


def _card_batches(batches: Iterator[pa.RecordBatch], carry: tuple[str, ...], kernel_rows: int,
                  stats: Accumulator | None) -> Iterator[pa.RecordBatch]:
    for table, key, ts in _keyed_tables(batches, "card_id", kernel_rows, stats, "card"):
        amount = table.column("amount").to_numpy().astype(np.float64, copy=False)
        events = CardEvents(key=key, ts_us=ts, amount=amount, merchant=value_codes(table.column("merchant_id")),
                            country=value_codes(table.column("country")))
        query = _flags(table, QUERY)
        if query.all():
            queries, rows = events, table
        else:
            q = np.flatnonzero(query)
            queries = CardEvents(key[q], ts[q], amount[q], events.merchant[q], events.country[q])
            rows = table.filter(pa.array(query))
        features = card_features(events, queries) | time_features(queries.ts_us) | {"amount": queries.amount}
        codes = arrow_categorical_codes(rows)
        columns = {name: rows.column(name) for name in ("transaction_id", "card_id", TS_US)}
        columns |= {name: pa.array(features[name], pa.float64()) if name in features else rows.column(name)
                    for name in fd.NUMERIC_FEATURES}
        columns |= {name: pa.array(codes[name], pa.int32()) for name in fd.CATEGORICAL_FEATURES}
        columns |= {name: rows.column(name) for name in carry}
        yield from pa.table(columns).to_batches()


def chunk_starts(buckets: list[tuple[int, int]], limit: int) -> list[int]:
    """Where a hot key's chunks after the first begin: ``buckets`` are ``(start_us, queries)`` of
    its query time buckets in time order; a chunk takes whole buckets while it holds at most
    ``limit`` queries (a bucket above ``limit`` is a chunk of its own)."""
    starts, running = [], 0
    for start, count in buckets:
        if running and running + count > limit:
            starts.append(start)
            running = 0
        running += count
    return starts


_NEVER, _FOREVER = -(2**62), 2**62


def hot_key_chunks(queries: DataFrame, key: str, hot_key_rows: int) -> list[tuple[str, int, int, int, int]]:
    """``(key, chunk, start_us, end_us, context_from_us)`` of each chunk of each ``key`` value found
    in more than ``hot_key_rows`` of the ``queries`` (payments with ``_ts_us``): two small
    aggregations, the driver receives only the hot keys' per-hour query counts. Chunk ``i`` emits
    the queries of ``[start, end)`` and reads the key's rows from ``context_from``: its first day's
    midnight minus ``LOOKBACK_DAYS``, where the local engine's history of that day begins."""
    hot = [r[0] for r in queries.groupBy(key).count().filter(F.col("count") > hot_key_rows).select(key).collect()]
    if not hot:
        return []
    hour = F.floor(F.col(TS_US) / HOT_KEY_BUCKET_US).cast("long")
    counts = queries.filter(F.col(key).isin(hot)).groupBy(key, hour.alias("_hour")).count().collect()
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in counts:
        per_key[row[0]].append((row[1] * HOT_KEY_BUCKET_US, row[2]))
    chunks = []
    for value, buckets in per_key.items():
        bounds = [_NEVER, *chunk_starts(sorted(buckets), hot_key_rows), _FOREVER]
        for i in range(len(bounds) - 1):
            context = _NEVER if i == 0 else (bounds[i] // US_PER_DAY - fd.LOOKBACK_DAYS) * US_PER_DAY
            chunks.append((value, i, bounds[i], bounds[i + 1], context))
    return chunks


def split_hot_keys(timeline: DataFrame, key: str, chunks: list[tuple[str, int, int, int, int]],
                   context: Sequence[str]) -> DataFrame:
    """``timeline`` with ``CHUNK`` added: 0 for every row of an ordinary key; a hot key's rows (its
    ``chunks``: :func:`hot_key_chunks`) go to each chunk whose ``[context_from, end)`` holds them, a
    query only in its own chunk, a copy elsewhere keeping only the ``context`` columns (the rest null)."""
    if not chunks:
        return timeline.withColumn(CHUNK, F.lit(0))
    table = timeline.sparkSession.createDataFrame(
        chunks, f"_hot_key string, {CHUNK} int, _start bigint, _end bigint, _from bigint")
    ts = F.col(TS_US)
    placed = timeline.join(F.broadcast(table),
                           (F.col(key) == F.col("_hot_key")) & (ts >= F.col("_from")) & (ts < F.col("_end")), "left")
    home = F.col("_hot_key").isNull() | (ts >= F.col("_start"))
    copied = {name: F.when(home, F.col(name)) for name in timeline.columns if name not in {*context, IS_TX, QUERY}}
    return (placed.withColumns(copied)
            .withColumn(QUERY, F.col(QUERY) & home)
            .withColumn(CHUNK, F.coalesce(F.col(CHUNK), F.lit(0)))
            .drop("_hot_key", "_start", "_end", "_from"))


def _by_key_chunk(frame: DataFrame, key: str, partitions: int) -> DataFrame:
    return frame.repartition(partitions, key, CHUNK).sortWithinPartitions(key, CHUNK, TS_US)


def apply_feature_kernel(tx: DataFrame, fraud_known: DataFrame, partitions: int, history: DataFrame | None = None,
                         carry: Sequence[str] = (), hot_key_rows: int | None = None, kernel_rows: int = KERNEL_ROWS,
                         stats: Accumulator | None = None) -> DataFrame:
    """Feature rows of ``tx`` (``PASSTHROUGH`` columns and ``carry``) given the merchant fraud-known
    instants (``merchant_id, _ts_us``) and the ``history`` payments (``PASSTHROUGH`` at least the
    ``CARD_HISTORY`` columns; counted in windows, never emitted): ``transaction_id, card_id, _ts_us``,
    ``FEATURE_COLUMNS`` and ``carry`` (columns of ``tx`` passed through, e.g. a row's place in its
    file). ``hot_key_rows``: split hotter keys (module doc; None: never). ``stats``: an accumulator of
    :class:`KernelCallStats`. With ``hot_key_rows`` set, the aggregations of :func:`hot_key_chunks`
    run at once (over ``tx``, per pass); the rest is lazy."""
    chunks = {key: hot_key_chunks(tx, key, hot_key_rows) if hot_key_rows is not None else []
              for key in ("merchant_id", "card_id")}
    carry = tuple(carry)
    carry_ddl = {name: tx.schema[name].dataType.simpleString() for name in carry}
    queries = tx.select(*PASSTHROUGH, *carry).withColumns({IS_TX: F.lit(True), QUERY: F.lit(True)})
    known = fraud_known.select(*MERCHANT_HISTORY).withColumns({IS_TX: F.lit(False), QUERY: F.lit(False)})
    timeline = queries.unionByName(known, allowMissingColumns=True)
    if history is not None:
        timeline = timeline.unionByName(
            history.select(*MERCHANT_HISTORY).withColumns({IS_TX: F.lit(True), QUERY: F.lit(False)}),
            allowMissingColumns=True)
    timeline = split_hot_keys(timeline, "merchant_id", chunks["merchant_id"], MERCHANT_HISTORY)
    merchant_pass = partial(_merchant_batches, carry=carry, kernel_rows=kernel_rows, stats=stats)
    with_merchant = (_by_key_chunk(timeline, "merchant_id", partitions)
                     .mapInArrow(merchant_pass, _ddl(_MERCHANT_PASS | carry_ddl))
                     .withColumn(QUERY, F.lit(True)))
    if history is not None:
        with_merchant = with_merchant.unionByName(history.select(*CARD_HISTORY).withColumn(QUERY, F.lit(False)),
                                                  allowMissingColumns=True)
    cards = split_hot_keys(with_merchant, "card_id", chunks["card_id"], CARD_HISTORY)
    card_pass = partial(_card_batches, carry=carry, kernel_rows=kernel_rows, stats=stats)
    return _by_key_chunk(cards, "card_id", partitions).mapInArrow(card_pass, _ddl(_CARD_PASS | carry_ddl))
