"""The payments a block of feature dates is computed from, read through the lookback cache.

A block of consecutive dates ``[first, last]`` (see :mod:`pipeline.ingest.feature_update`) needs

* every payment of ``[first - LOOKBACK_DAYS, last]`` with its ids coded (the kernel's history),
  and the raw columns of the block's own dates (the rows it writes);
* the merchant and time of the payments of the fraud reports usable in the block's windows, on the
  dates where the identity index places them (:func:`fraud_payments`).

The kernel reads the span's payments sorted per key (:class:`~pipeline.features.arrow_kernel.SortedPayments`).
They come from the cache's sorted history for the dates of the lookback it holds (those dates'
raw files unchanged), with the later dates, read as below, and the block's own merged in: a night
sorts a few days, not 31, and stores the merged history only once it merged ``REBASE_DAYS`` dates
or more (else it keeps the stored one, and the next night merges one more date). When the stored
history cannot serve the block (a late payment on a date it holds, a block before it, a new
vocabulary), every date of the lookback is read as below and the span is sorted afresh, and the
result is stored.

A date read from the cache comes from the lookback cache when its entry was coded from the date's
committed raw files as they are now; otherwise, and for the block's own dates, from those raw files,
coded with the cache's vocabulary. Every date of the span read from raw is written back. A report's
payment is looked up once and stored with the date's key; a night looks up only the reports it has
not seen, on their payments' dates (a date before the span: cached, else three columns from raw,
not written back).

Guarantee: the same payments as reading the raw files of every date, each date's in time order
(ties in file order), and sorted per key as :func:`pipeline.features.arrow_kernel.sort_payments`
sorts them; only the order of a key's same-instant payments and the id coding may differ, and the
kernel's values depend on neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind
from pipeline.datasets.id_vocabulary import IdVocabulary
from pipeline.datasets.lookback_cache import CODED_SCHEMA, HISTORY_SCHEMA, MATCHED_SCHEMA, LookbackCache
from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import (
    PAYMENT_COLUMNS,
    CodedPayments,
    SortedPayments,
    epoch_us,
    merge_sorted,
    sort_payments,
)
from pipeline.features.kernel import US_PER_DAY, KeyedTimes
from pipeline.ingest.feature_inputs import raw_files_keys
from pipeline.ingest.id_index import EPOCH
from pipeline.ingest.raw_layout import RawStore, raw_arrow_schema
from pipeline.ingest.raw_reader import read_files

LOOKBACK = timedelta(days=fd.LOOKBACK_DAYS)
# A night merges into the stored sorted history the dates after it (from their date files) and its
# own; once that is this many dates it stores the merged history (30 days of payments) in its place.
# Between, a night writes only its own date file: the history's write, some 40 bytes per payment of
# the lookback, comes once per REBASE_DAYS nights, and the merge stays about one sort of a week.
REBASE_DAYS = 7
MATCHED_COLUMNS = ["transaction_id", "merchant", "ts_us"]  # what matching fraud reports to payments reads
_LOOKUP_SCHEMA = pa.schema([CODED_SCHEMA.field(c) for c in MATCHED_COLUMNS])
_RAW_SCHEMA = pa.schema([raw_arrow_schema(Kind.TRANSACTION).field(c) for c in PAYMENT_COLUMNS])


@dataclass(frozen=True)
class BlockPayments:
    """What a block is computed from (see the module doc)."""

    # CODED_SCHEMA of the dates read, each in time order: the block's own and those of its lookback
    # the stored sorted history lacks (all of them when it was a miss)
    dated: dict[date, pa.Table]
    rows: pa.Table  # PAYMENT_COLUMNS of the block's own dates
    own: CodedPayments  # the same payments, coded, in the same order
    history: SortedPayments  # every payment of [first - LOOKBACK, last], sorted per key
    keys: dict[date, str]  # what each date of the span was read from (:func:`raw_files_keys`)
    vocabulary: IdVocabulary  # the codes' vocabulary (stored)


def code_payments(raw: pa.Table, vocabulary: IdVocabulary) -> tuple[pa.Table, IdVocabulary]:
    """Raw payments (``PAYMENT_COLUMNS``) as ``CODED_SCHEMA`` rows, and the vocabulary grown by their new ids."""
    (card, merchant, country), vocabulary = vocabulary.code_columns(
        raw.column("card_id"), raw.column("merchant_id"), raw.column("country"))
    coded = pa.table({"transaction_id": raw.column("transaction_id"), "card": card, "merchant": merchant,
                      "country": country, "ts_us": epoch_us(raw.column("event_time")), "amount": raw.column("amount")})
    return coded.cast(CODED_SCHEMA), vocabulary


def read_block_payments(store: RawStore, cache: LookbackCache, files: dict[date, list[Path]],
                        days: list[date]) -> BlockPayments:
    """The payments block ``days`` (consecutive) is computed from; ``files``: committed raw
    transaction files per date. Writes the cache entries of the dates it read from raw, and the
    sorted history of the span's last ``LOOKBACK_DAYS`` dates when it read no stored one or read
    ``REBASE_DAYS`` dates or more beyond it (module doc)."""
    first, last = days[0], days[-1]
    start = first - LOOKBACK
    span = [start + timedelta(days=i) for i in range((last - start).days + 1)]
    span = [d for d in span if d in files]
    keys = raw_files_keys(store, {d: files[d] for d in span})
    vocabulary = cache.read_vocabulary()
    carried = cache.read_history(start, {d: keys[d] for d in span if d < first}, vocabulary)
    later = carried[1] if carried is not None else [d for d in span if d < first]  # what the stored history lacks
    by_date = {d: cache.read_date(d, keys[d], vocabulary) for d in later}
    own_days = [d for d in span if d >= first]
    from_raw = [d for d in later if by_date[d] is None] + own_days
    raw = {d: _in_time_order(read_files(files[d], Kind.TRANSACTION, PAYMENT_COLUMNS)) for d in from_raw}
    coded, grown = code_payments(_concat(list(raw.values()), _RAW_SCHEMA), vocabulary)
    if grown is not vocabulary:
        cache.write_vocabulary(grown)  # before any date file holding its new codes
    offset = 0
    for day in from_raw:
        by_date[day], offset = coded.slice(offset, raw[day].num_rows), offset + raw[day].num_rows
        cache.write_date(day, keys[day], grown, by_date[day])
    history = sort_payments(_coded(_concat([by_date[d] for d in later + own_days], CODED_SCHEMA)))
    if carried is not None:
        history = merge_sorted(_sorted_history(carried[0]), history, _midnight_us(start))
    if carried is None or len(later) + len(own_days) >= REBASE_DAYS:
        next_start = last - LOOKBACK + timedelta(days=1)  # the lookback of the night after ``last``
        cache.write_history(_history_table(history.since(_midnight_us(next_start))),
                            {d: keys[d] for d in span if d >= next_start}, grown)
    own = _coded(_concat([by_date[d] for d in own_days], CODED_SCHEMA))
    return BlockPayments(by_date, _concat([raw[d] for d in own_days], _RAW_SCHEMA), own, history, keys, grown)


def _midnight_us(day: date) -> int:
    return (day - EPOCH).days * US_PER_DAY


def _coded(table: pa.Table) -> CodedPayments:
    """``CODED_SCHEMA`` rows as the kernel reads them."""
    def column(name: str, dtype) -> np.ndarray:
        return table.column(name).to_numpy().astype(dtype, copy=False)

    return CodedPayments(column("card", np.int64), column("merchant", np.int64), column("country", np.int64),
                         column("ts_us", np.int64), column("amount", np.float64))


def _sorted_history(table: pa.Table) -> SortedPayments:
    """A stored history (``HISTORY_SCHEMA``) as the kernel reads it."""
    def column(name: str, dtype=np.int64) -> np.ndarray:
        return table.column(name).to_numpy().astype(dtype, copy=False)

    return SortedPayments(CodedPayments(column("card"), column("merchant"), column("country"), column("ts_us"),
                                        column("amount", np.float64)),
                          KeyedTimes(column("merchant_key"), column("merchant_ts_us")))


def _history_table(history: SortedPayments) -> pa.Table:
    """``history`` as it is stored (``HISTORY_SCHEMA``)."""
    c, m = history.by_card, history.by_merchant
    return pa.Table.from_arrays([pa.array(c.card.astype(np.int32)), pa.array(c.merchant.astype(np.int32)),
                                 pa.array(c.country.astype(np.int32)), pa.array(c.ts_us), pa.array(c.amount),
                                 pa.array(m.key.astype(np.int32)), pa.array(m.ts_us)], schema=HISTORY_SCHEMA)


def fraud_payments(store: RawStore, cache: LookbackCache, files: dict[date, list[Path]], block: BlockPayments,
                   ids: pa.Array, located: np.ndarray) -> pa.Table:
    """``MATCHED_COLUMNS`` of the payments of the fraud reports ``ids``, which the identity index
    places on the partition dates ``located`` (days since 1970), merchants coded as ``block``'s; may
    hold other payments of those dates' reports too.

    Matches stored by earlier builds are reused while their payment date's raw files are unchanged
    (see :mod:`pipeline.datasets.lookback_cache`); only the other reports are looked up, among the
    payments of their own dates (the block's, else cached or raw ones), and the matches are stored
    back. A report whose payment is not on its date (an identity-index collision) matches nothing."""
    dates = sorted({EPOCH + timedelta(days=int(d)) for d in np.unique(located)} & files.keys())
    keys = {d: block.keys[d] for d in dates if d in block.keys}
    keys |= raw_files_keys(store, {d: files[d] for d in dates if d not in keys})
    cached = cache.read_matched(keys, block.vocabulary)
    unmatched = pc.invert(pc.is_in(ids, value_set=cached.column("transaction_id"))).to_numpy(zero_copy_only=False)
    if not unmatched.any():
        return cached.select(MATCHED_COLUMNS)
    wanted = ids.filter(pa.array(unmatched))
    search = sorted({EPOCH + timedelta(days=int(d)) for d in np.unique(located[unmatched])} & files.keys())
    payments, vocabulary = _dated_payments(cache, files, block, {d: keys[d] for d in search})
    found = [cached]
    for day, table in payments.items():
        named = table.filter(pc.is_in(table.column("transaction_id"), value_set=wanted))
        found.append(pa.Table.from_arrays(
            [pa.array(np.full(named.num_rows, (day - EPOCH).days, np.int32)), *named.columns],
            schema=MATCHED_SCHEMA))
    matched = pa.concat_tables(found)
    if vocabulary is not block.vocabulary:
        cache.write_vocabulary(vocabulary)  # before the matches holding its new codes
    cache.write_matched(matched, keys, vocabulary)
    return matched.select(MATCHED_COLUMNS)


def _dated_payments(cache: LookbackCache, files: dict[date, list[Path]], block: BlockPayments,
                    keys: dict[date, str]) -> tuple[dict[date, pa.Table], IdVocabulary]:
    """``MATCHED_COLUMNS`` of the payments of each date of ``keys`` (their raw files' keys): the
    block's dates as it holds them, cached dates as they are, the rest read from raw, coded with
    ``block``'s vocabulary grown by their merchants (returned, not yet stored). Raw reads are not
    cached: a full rebuild looks reports up on up to ``label_match_days`` dates before its history."""
    out, vocabulary = {}, block.vocabulary
    for day, key in keys.items():
        table = block.dated.get(day)
        if table is None:
            table = cache.read_date(day, key, vocabulary)
        if table is None:
            raw = read_files(files[day], Kind.TRANSACTION, ["transaction_id", "merchant_id", "event_time"])
            merchant, vocabulary = vocabulary.code(raw.column("merchant_id"))
            table = pa.Table.from_arrays([raw.column("transaction_id"), pa.array(merchant),
                                          pa.array(epoch_us(raw.column("event_time")))], schema=_LOOKUP_SCHEMA)
        out[day] = table.select(MATCHED_COLUMNS)
    return out, vocabulary


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
