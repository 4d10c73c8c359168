"""The payments a block of feature dates is computed from, read through the lookback cache.

A block of consecutive dates ``[first, last]`` (see :mod:`pipeline.ingest.feature_update`) needs

* every payment of ``[first - LOOKBACK_DAYS, last]`` with its ids coded (the kernel's history),
  and the raw columns of the block's own dates (the rows it writes);
* the merchant and time of the payments of the fraud reports usable in the block's windows, on the
  dates where the identity index places them (:func:`fraud_payments`).

A date before ``first`` comes from the lookback cache (:mod:`pipeline.datasets.lookback_cache`)
when its entry was coded from the date's committed raw files as they are now; otherwise, and for
the block's own dates, from those raw files, coded with the cache's vocabulary. Every date of the
span read from raw is written back, so the next night reads 30 cached dates and one raw one. A
report's payment is looked up once and stored with the date's key; a night looks up only the
reports it has not seen, on their payments' dates (a date before the span: cached, else three
columns from raw, not written back).

Guarantee: the same payments as reading the raw files of every date, each date's in time order
(ties in file order); only the row order within a date and the id coding differ, and the kernel's
values depend on neither.
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
from pipeline.datasets.lookback_cache import CODED_SCHEMA, MATCHED_SCHEMA, LookbackCache
from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import PAYMENT_COLUMNS, CodedPayments, epoch_us
from pipeline.ingest.feature_inputs import raw_files_keys
from pipeline.ingest.id_index import EPOCH
from pipeline.ingest.raw_layout import RawStore, raw_arrow_schema
from pipeline.ingest.raw_reader import read_files

LOOKBACK = timedelta(days=fd.LOOKBACK_DAYS)
MATCHED_COLUMNS = ["transaction_id", "merchant", "ts_us"]  # what matching fraud reports to payments reads
_LOOKUP_SCHEMA = pa.schema([CODED_SCHEMA.field(c) for c in MATCHED_COLUMNS])
_RAW_SCHEMA = pa.schema([raw_arrow_schema(Kind.TRANSACTION).field(c) for c in PAYMENT_COLUMNS])


@dataclass(frozen=True)
class BlockPayments:
    """What a block is computed from (see the module doc)."""

    dated: dict[date, pa.Table]  # CODED_SCHEMA: each date of [first - LOOKBACK, last] (in order), in time order
    rows: pa.Table  # PAYMENT_COLUMNS of the block's own dates: the last rows.num_rows rows of history
    keys: dict[date, str]  # what each date of ``dated`` was read from (:func:`raw_files_keys`)
    vocabulary: IdVocabulary  # the codes' vocabulary (stored)

    def coded(self) -> CodedPayments:
        """Every payment of the span in time order (the dates concatenated), as the kernel reads them."""
        history = _concat(list(self.dated.values()), CODED_SCHEMA)

        def column(name: str, dtype) -> np.ndarray:
            return history.column(name).to_numpy().astype(dtype, copy=False)

        return CodedPayments(column("card", np.int64), column("merchant", np.int64), column("country", np.int64),
                             column("ts_us", np.int64), column("amount", np.float64))

    def own_rows(self) -> np.ndarray:
        """Indices of the block's own payments in :meth:`coded`."""
        total = sum(t.num_rows for t in self.dated.values())
        return np.arange(total - self.rows.num_rows, total)


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
    transaction files per date. Writes the cache entries of the dates it read from raw (module doc)."""
    first, last = days[0], days[-1]
    span = [first - LOOKBACK + timedelta(days=i) for i in range((last - first + LOOKBACK).days + 1)]
    span = [d for d in span if d in files]
    keys = raw_files_keys(store, {d: files[d] for d in span})
    vocabulary = cache.read_vocabulary()
    by_date = {d: cache.read_date(d, keys[d], vocabulary) for d in span if d < first}
    from_raw = [d for d in span if by_date.get(d) is None]
    raw = {d: _in_time_order(read_files(files[d], Kind.TRANSACTION, PAYMENT_COLUMNS)) for d in from_raw}
    coded, grown = code_payments(_concat(list(raw.values()), _RAW_SCHEMA), vocabulary)
    if grown is not vocabulary:
        cache.write_vocabulary(grown)  # before any date file holding its new codes
    offset = 0
    for day in from_raw:
        by_date[day], offset = coded.slice(offset, raw[day].num_rows), offset + raw[day].num_rows
        cache.write_date(day, keys[day], grown, by_date[day])
    own = [raw[d] for d in span if d >= first]
    return BlockPayments({d: by_date[d] for d in span}, _concat(own, _RAW_SCHEMA), keys, grown)


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
