"""The payments a block of feature dates is computed from, read through the lookback cache.

A block of consecutive dates ``[first, last]`` (see :mod:`pipeline.ingest.feature_update`) needs

* every payment of ``[first - LOOKBACK_DAYS, last]`` with its ids coded (the kernel's history),
  and the raw columns of the block's own dates (the rows it writes);
* the transaction id, merchant and time of the payments on the ``earlier`` dates, where the
  identity index places payments of fraud reports usable in the block's windows.

A date before ``first`` comes from the lookback cache (:mod:`pipeline.datasets.lookback_cache`)
when its entry was coded from the date's committed raw files as they are now; otherwise, and for
the block's own dates, from those raw files, coded with the cache's vocabulary. Every date of the
span read from raw is written back, so the next night reads 30 cached dates and one raw one. An
earlier date is read from the cache when it holds it, else only its three columns from raw, and is
not written back (a full rebuild locates reports on up to ``label_match_days`` of them).

Guarantee: the same payments as reading the raw files of every date, each date's in time order
(ties in file order); only the row order within a date and the id coding differ, and the kernel's
values depend on neither.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.contract import Kind
from pipeline.datasets.id_vocabulary import IdVocabulary
from pipeline.datasets.lookback_cache import CODED_SCHEMA, LookbackCache
from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import PAYMENT_COLUMNS, CodedPayments, epoch_us
from pipeline.ingest.feature_inputs import read_files
from pipeline.ingest.raw_layout import RawStore, raw_arrow_schema

LOOKBACK = timedelta(days=fd.LOOKBACK_DAYS)
MATCHED_COLUMNS = ["transaction_id", "merchant", "ts_us"]  # what matching fraud reports to payments reads
_MATCHED_SCHEMA = pa.schema([CODED_SCHEMA.field(c) for c in MATCHED_COLUMNS])
_RAW_SCHEMA = pa.schema([raw_arrow_schema(Kind.TRANSACTION).field(c) for c in PAYMENT_COLUMNS])


@dataclass(frozen=True)
class BlockPayments:
    """What a block is computed from (see the module doc)."""

    history: pa.Table  # CODED_SCHEMA: every payment of [first - LOOKBACK, last], in time order
    rows: pa.Table  # PAYMENT_COLUMNS of the block's own dates: the last rows.num_rows rows of history
    earlier: pa.Table  # MATCHED_COLUMNS of the earlier dates' payments

    def coded(self) -> CodedPayments:
        def column(name: str, dtype) -> np.ndarray:
            return self.history.column(name).to_numpy().astype(dtype, copy=False)

        return CodedPayments(column("card", np.int64), column("merchant", np.int64), column("country", np.int64),
                             column("ts_us", np.int64), column("amount", np.float64))

    def own_rows(self) -> np.ndarray:
        """Indices of the block's own payments in ``history``."""
        return np.arange(self.history.num_rows - self.rows.num_rows, self.history.num_rows)

    def matchable(self) -> pa.Table:
        """``MATCHED_COLUMNS`` of every payment here, for matching fraud reports to their payments."""
        return pa.concat_tables([self.history.select(MATCHED_COLUMNS), self.earlier])


def raw_files_keys(store: RawStore, files: dict[date, list[Path]]) -> dict[date, str]:
    """What each date's cache entry is coded from: its committed raw files (immutable once
    committed: a late payment lands as a new file) in this store."""
    root = str(store.root.resolve())  # once: resolving costs a system call per path component

    def key(paths: list[Path]) -> str:
        named = {"raw_store": root, "files": sorted(str(p.relative_to(store.root)) for p in paths)}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()

    return {day: key(paths) for day, paths in files.items()}


def code_payments(raw: pa.Table, vocabulary: IdVocabulary) -> tuple[pa.Table, IdVocabulary]:
    """Raw payments (``PAYMENT_COLUMNS``) as ``CODED_SCHEMA`` rows, and the vocabulary grown by their new ids."""
    card, vocabulary = vocabulary.code(raw.column("card_id"))
    merchant, vocabulary = vocabulary.code(raw.column("merchant_id"))
    country, vocabulary = vocabulary.code(raw.column("country"))
    coded = pa.table({"transaction_id": raw.column("transaction_id"), "card": card, "merchant": merchant,
                      "country": country, "ts_us": epoch_us(raw.column("event_time")), "amount": raw.column("amount")})
    return coded.cast(CODED_SCHEMA), vocabulary


def _earlier_payments(cache: LookbackCache, files: dict[date, tuple[list[Path], str]],
                      vocabulary: IdVocabulary) -> tuple[pa.Table, IdVocabulary]:
    """``MATCHED_COLUMNS`` of the payments of the dates of ``files`` (``day -> (raw files, their
    key)``): cached dates as they are, the rest read from raw."""
    tables, raw_files = [], []
    for day, (paths, key) in files.items():
        cached = cache.read_date(day, key, vocabulary)
        if cached is not None:
            tables.append(cached.select(MATCHED_COLUMNS))
        else:
            raw_files += paths
    raw = read_files(raw_files, Kind.TRANSACTION, ["transaction_id", "merchant_id", "event_time"])
    merchant, vocabulary = vocabulary.code(raw.column("merchant_id"))
    tables.append(pa.Table.from_arrays([raw.column("transaction_id"), pa.array(merchant),
                                        pa.array(epoch_us(raw.column("event_time")))], schema=_MATCHED_SCHEMA))
    return pa.concat_tables(tables), vocabulary


def read_block_payments(store: RawStore, cache: LookbackCache, files: dict[date, list[Path]], days: list[date],
                        earlier: list[date]) -> BlockPayments:
    """The payments block ``days`` (consecutive) is computed from; ``files``: committed raw
    transaction files per date; ``earlier``: dates before the lookback to match fraud reports on.
    Writes the cache entries of the dates it read from raw (module doc)."""
    first, last = days[0], days[-1]
    span = [first - LOOKBACK + timedelta(days=i) for i in range((last - first + LOOKBACK).days + 1)]
    span = [d for d in span if d in files]
    earlier = [d for d in earlier if d in files]
    keys = raw_files_keys(store, {d: files[d] for d in span + earlier})
    vocabulary = cache.read_vocabulary()
    by_date = {d: cache.read_date(d, keys[d], vocabulary) for d in span if d < first}
    from_raw = [d for d in span if by_date.get(d) is None]
    raw = {d: _in_time_order(read_files(files[d], Kind.TRANSACTION, PAYMENT_COLUMNS)) for d in from_raw}
    coded, grown = code_payments(_concat(list(raw.values()), _RAW_SCHEMA), vocabulary)
    earlier_payments, grown = _earlier_payments(cache, {d: (files[d], keys[d]) for d in earlier}, grown)
    if grown is not vocabulary:
        cache.write_vocabulary(grown)  # before any date file holding its new codes
    offset = 0
    for day in from_raw:
        by_date[day], offset = coded.slice(offset, raw[day].num_rows), offset + raw[day].num_rows
        cache.write_date(day, keys[day], grown, by_date[day])
    own = [raw[d] for d in span if d >= first]
    return BlockPayments(_concat([by_date[d] for d in span], CODED_SCHEMA), _concat(own, _RAW_SCHEMA),
                         earlier_payments)


def _in_time_order(payments: pa.Table) -> pa.Table:
    """A date's payments sorted by time (ties as read). With every date so, a block's history is in
    time order, which lets the kernel sort it by card or merchant in linear time
    (:func:`pipeline.features.arrow_kernel.key_time_order`)."""
    ts = epoch_us(payments.column("event_time"))
    if bool(np.all(ts[1:] >= ts[:-1])):
        return payments  # already so (one file in time order, the usual case): no copy
    return payments.take(pa.array(np.argsort(ts, kind="stable")))


def _concat(tables: list[pa.Table], schema: pa.Schema) -> pa.Table:
    return pa.concat_tables(tables) if tables else schema.empty_table()
