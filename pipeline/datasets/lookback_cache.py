"""The lookback cache: each event date's payments as the window kernel reads them, coded once.

A night computes one new date from its payments and those of the 30 days before it. Without the
cache it reads those 31 days of raw Parquet (eight columns, ids as strings) and codes every id again
each night; with it, a date is read from the raw store and coded when a build first needs it, and
later builds load it as integer columns that merge by concatenation.

Layout under the feature table's ``_lookback/`` (:meth:`pipeline.datasets.feature_table.FeatureTable.lookback_cache`)::

    ids.arrow                 # the id vocabulary (IdVocabulary) of card, merchant and country ids
    date=YYYY-MM-DD.arrow     # the date's payments (CODED_SCHEMA), in time order
    history.arrow             # a lookback's payments sorted per key (HISTORY_SCHEMA)
    frauds.arrow              # the fraud reports of each report date (FRAUD_SCHEMA)
    fraud_payments.arrow      # the payments fraud reports were matched to (MATCHED_SCHEMA)
    .<name>.tmp-<pid>         # a file being written (a killed write leaves only this)

The two fraud files spare a night what grows with history rather than with the new day: reading
some sixty days of label files, and matching that window's reports against the payments of every
date they name (a string probe per payment, ~1M payments on the dev layout). With them a night
reads the new report date's files and matches only the reports it has not matched before.

The history file carries the kernel's sort from night to night: the payments of a run of dates,
sorted by (card, time) and, in two more columns, by (merchant, time). A night takes from it the
dates of its lookback it holds, merges in (linear) the few later dates from their date files and
its own new date, and only every few nights stores the merged result as the new history
(:mod:`pipeline.ingest.block_payments`): it neither concatenates 30 date files and sorts them again
nor writes 30 days of payments every night. It is trusted only for the dates it was made from, each
still coded from the raw files that date has now (the same keys as the date files), and under the
same vocabulary: a late payment on one of them, a lookback it does not reach the start of, or a
build of earlier dates is a miss, and the build reads the date files instead.

Arrow IPC files, uncompressed and memory-mapped when read: loading a date reads its footer, not its
rows, until the kernel copies the columns it needs.

Validity: a date file's schema metadata names what it was coded from (``key``: the caller's digest
of the date's committed raw files) and the vocabulary its codes need (generation, length).
:meth:`LookbackCache.read_date` returns the rows only when that key equals the key the caller
computes now and the vocabulary is of that generation and at least that long. Anything else is a
miss (late payments: a new raw file, so a new key; a vocabulary started afresh; a file that does not
parse): the caller reads the raw files again and rewrites the date. The fraud files follow the same
rule per row: a row is trusted only when the raw files of its date (the report date for ``frauds``,
the payment's date for ``fraud_payments``) still have the key stored for that date, and a matched
payment's merchant code only under its vocabulary. A payment never changes once committed (ingest
keeps the first copy of a transaction id), so a match stays right while its date's files do.

Atomicity: each file is replaced in one rename (:func:`pipeline.atomic.atomic_path`): a reader sees
the previous file or the complete new one. The vocabulary is written durably before any date file
that uses its new codes, so no date file can outlive the codes it refers to. Date and history files
skip the fsync: one lost to a power cut is a miss, never a wrong code. Writers hold the raw store's lock.

Compaction: the vocabulary only grows between compactions, and the card base turns over, so without
them it would hold every id ever seen (each night hashing it, rewriting it, and running towards the
int32 cap). When fewer than :data:`MIN_LIVE_SHARE` of its ids are used by the cached files,
:meth:`LookbackCache.compact` starts a new generation with only those ids and rewrites every cached
file with the codes remapped (the fraud reports copied as they are), in a new directory published
over this one in one exchange (:func:`pipeline.atomic.staged_dir`): a reader sees the old generation
whole or the new one whole, and a kill before the exchange leaves the old one in place (its staging
directory, a dot-name sibling, is removed by the next :meth:`LookbackCache.discard_before`). Codes
change, the ids they stand for do not, so the kernel's values are the same. The history file is not
carried over (the next night rebuilds it from the date files). Each date file records how many
distinct codes it uses: while one of them alone uses at least the live share of the vocabulary,
the live set is that large too, and the nightly check reads one footer instead of every file.
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.atomic import atomic_path, staged_dir, temporary_path
from pipeline.datasets.id_vocabulary import IdVocabulary

VOCABULARY_FILE = "ids.arrow"
CACHE_FORMAT = 1  # bump when CODED_SCHEMA or the coding changes: every date file becomes a miss
# A date's payments: ids coded by the vocabulary (card, merchant, country), the event time in epoch
# microseconds; transaction ids kept to match fraud reports to their payments.
CODED_SCHEMA = pa.schema([("transaction_id", pa.string()), ("card", pa.int32()), ("merchant", pa.int32()),
                          ("country", pa.int32()), ("ts_us", pa.int64()), ("amount", pa.float64())])
# A report date's fraud reports (is_fraud true), as the plan's first-report rule reads them.
FRAUD_SCHEMA = pa.schema([("report_date", pa.int32()), ("transaction_id", pa.string()), ("reported_us", pa.int64())])
# The payment a fraud report names: its date (days since 1970), merchant code and event time.
MATCHED_SCHEMA = pa.schema([("payment_date", pa.int32()), ("transaction_id", pa.string()), ("merchant", pa.int32()),
                            ("ts_us", pa.int64())])
# The payments of a lookback, sorted by (card, time): the card pass's history as the kernel reads it;
# ``merchant_key``/``merchant_ts_us``: the same payments' merchant and time, sorted by (merchant, time).
HISTORY_SCHEMA = pa.schema([("card", pa.int32()), ("merchant", pa.int32()), ("country", pa.int32()),
                            ("ts_us", pa.int64()), ("amount", pa.float64()), ("merchant_key", pa.int32()),
                            ("merchant_ts_us", pa.int64())])
HISTORY_FILE = "history.arrow"
FRAUDS_FILE = "frauds.arrow"
MATCHED_FILE = "fraud_payments.arrow"
_EPOCH = date(1970, 1, 1)
_META = b"lookback"
CODE_COLUMNS = ("card", "merchant", "country")  # the coded columns of a date file
# Compact when fewer than this share of the vocabulary's ids are used by the cached files. At one
# half the vocabulary a night hashes (and rewrites, fsynced, when it grows) stays within about twice
# the live set, and a compaction (rewriting the ~31 cached dates, about what a night with a cold
# cache writes) comes at most once per half turnover of the card base: whatever the history, a
# night's cost stays a small constant factor of the live set's. Lower saves compactions and lets
# the vocabulary grow further; higher compacts for little gain.
MIN_LIVE_SHARE = 0.5


class LookbackCache:
    """One lookback cache directory (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def date_file(self, day: date) -> Path:
        return self.root / f"date={day.isoformat()}.arrow"

    def read_vocabulary(self) -> IdVocabulary:
        """The stored vocabulary; a new one (a new generation) when there is none readable."""
        try:
            table = _read_ipc(self.root / VOCABULARY_FILE)
            return IdVocabulary(json.loads(table.schema.metadata[_META])["generation"],
                                table.column("value").combine_chunks())
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
            return IdVocabulary.start()

    def write_vocabulary(self, vocabulary: IdVocabulary) -> None:
        """Replace the stored vocabulary, durably (date files written after it may use its codes)."""
        meta = {_META: json.dumps({"generation": vocabulary.generation})}
        _write_ipc(pa.table({"value": vocabulary.values}).replace_schema_metadata(meta),
                   self.root / VOCABULARY_FILE, durable=True)

    def read_date(self, day: date, key: str, vocabulary: IdVocabulary) -> pa.Table | None:
        """``day``'s coded payments when they were coded from what ``key`` names, with codes valid
        under ``vocabulary``; None otherwise (a miss: see the module doc)."""
        try:
            table = _read_ipc(self.date_file(day))
            meta = json.loads(table.schema.metadata[_META])
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
            return None
        valid = (meta.get("format") == CACHE_FORMAT and meta.get("key") == key
                 and meta.get("generation") == vocabulary.generation and meta.get("ids", 1 << 62) <= len(vocabulary)
                 and table.schema.remove_metadata().equals(CODED_SCHEMA))
        return table.replace_schema_metadata(None) if valid else None

    def write_date(self, day: date, key: str, vocabulary: IdVocabulary, rows: pa.Table) -> None:
        """Store ``day``'s coded payments (``CODED_SCHEMA``; codes from ``vocabulary``, which must be
        stored already) as coded from what ``key`` names."""
        meta = {"format": CACHE_FORMAT, "key": key, "generation": vocabulary.generation, "ids": len(vocabulary),
                "distinct": _distinct_codes(len(vocabulary), rows)}
        rows = rows.cast(CODED_SCHEMA).replace_schema_metadata({_META: json.dumps(meta)})
        _write_ipc(rows, self.date_file(day), durable=False)

    def read_history(self, start: date, keys: dict[date, str],
                     vocabulary: IdVocabulary) -> tuple[pa.Table, list[date]] | None:
        """``(rows, later)`` when the stored sorted history (``HISTORY_SCHEMA``) can serve a lookback
        from ``start`` over the dates of ``keys`` (those with payments, none before ``start``): it was
        stored under ``vocabulary``'s generation (at most its length), and its dates from ``start``
        on are exactly the dates of ``keys`` up to its own last date, at least one, each read from
        the files its key names. ``rows`` may hold dates before ``start`` (the caller cuts them by
        time); ``later``: the dates of ``keys`` after its last, for the caller to read from their
        date files. None otherwise (a miss)."""
        try:
            table = _read_ipc(self.root / HISTORY_FILE)
            meta = json.loads(table.schema.metadata[_META])
            stored = {date.fromisoformat(day): key for day, key in meta["keys"].items()}
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError, AttributeError):
            return None
        valid = (meta.get("format") == CACHE_FORMAT and meta.get("generation") == vocabulary.generation
                 and meta.get("ids", 1 << 62) <= len(vocabulary) and table.schema.remove_metadata().equals(HISTORY_SCHEMA))
        held = {day: key for day, key in stored.items() if day >= start}
        if not valid or not held or held != {day: key for day, key in keys.items() if day <= max(held)}:
            return None
        return table.replace_schema_metadata(None), sorted(day for day in keys if day > max(held))

    def write_history(self, rows: pa.Table, keys: dict[date, str], vocabulary: IdVocabulary) -> None:
        """Store ``rows`` (``HISTORY_SCHEMA``, codes from ``vocabulary``, stored already): the payments
        of the dates of ``keys``, read from the files ``keys`` names; replaces what was stored."""
        meta = {"format": CACHE_FORMAT, "keys": {day.isoformat(): key for day, key in keys.items()},
                "generation": vocabulary.generation, "ids": len(vocabulary)}
        _write_ipc(rows.cast(HISTORY_SCHEMA).replace_schema_metadata({_META: json.dumps(meta)}),
                   self.root / HISTORY_FILE, durable=False)

    def read_frauds(self, keys: dict[date, str]) -> tuple[pa.Table, list[date]]:
        """``(rows, missing)``: the stored fraud reports (``FRAUD_SCHEMA``) of the report dates of
        ``keys`` whose files still have that key, and the dates of ``keys`` the cache cannot answer."""
        return self._read_dated(FRAUDS_FILE, FRAUD_SCHEMA, "report_date", keys, lambda meta: True)

    def write_frauds(self, rows: pa.Table, keys: dict[date, str]) -> None:
        """Store ``rows`` (``FRAUD_SCHEMA``): every fraud report of the report dates of ``keys``, read
        from the files ``keys`` names; replaces what was stored."""
        self._write_dated(FRAUDS_FILE, FRAUD_SCHEMA, rows, keys, {})

    def read_matched(self, keys: dict[date, str], vocabulary: IdVocabulary) -> pa.Table:
        """The stored report-to-payment matches (``MATCHED_SCHEMA``) on the payment dates of ``keys``
        whose files still have that key, when their merchant codes hold under ``vocabulary``."""
        def codes_hold(meta: dict) -> bool:
            return meta.get("generation") == vocabulary.generation and meta.get("ids", 1 << 62) <= len(vocabulary)

        return self._read_dated(MATCHED_FILE, MATCHED_SCHEMA, "payment_date", keys, codes_hold)[0]

    def write_matched(self, rows: pa.Table, keys: dict[date, str], vocabulary: IdVocabulary) -> None:
        """Store ``rows`` (``MATCHED_SCHEMA``; merchant codes from ``vocabulary``, stored already): the
        matches on the payment dates of ``keys``, made from the files ``keys`` names."""
        self._write_dated(MATCHED_FILE, MATCHED_SCHEMA, rows, keys,
                          {"generation": vocabulary.generation, "ids": len(vocabulary)})

    def _read_dated(self, name: str, schema: pa.Schema, column: str, keys: dict[date, str],
                    meta_ok) -> tuple[pa.Table, list[date]]:
        try:
            table = _read_ipc(self.root / name)
            meta = json.loads(table.schema.metadata[_META])
            stored = meta["keys"] if meta.get("format") == CACHE_FORMAT and meta_ok(meta) else {}
            if not table.schema.remove_metadata().equals(schema):
                raise ValueError(f"{name}: schema {table.schema}")
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
            return schema.empty_table(), sorted(keys)
        valid = [day for day, key in keys.items() if stored.get(day.isoformat()) == key]
        days = pa.array([(day - _EPOCH).days for day in valid], pa.int32())
        rows = table.replace_schema_metadata(None).filter(pc.is_in(table.column(column), value_set=days))
        return rows, sorted(set(keys) - set(valid))

    def _write_dated(self, name: str, schema: pa.Schema, rows: pa.Table, keys: dict[date, str], meta: dict) -> None:
        meta = {"format": CACHE_FORMAT, "keys": {day.isoformat(): key for day, key in keys.items()}, **meta}
        _write_ipc(rows.cast(schema).replace_schema_metadata({_META: json.dumps(meta)}), self.root / name, durable=False)

    def discard_before(self, day: date, *, min_live_share: float = MIN_LIVE_SHARE) -> list[Path]:
        """Delete the date files before ``day`` and what killed writes and compactions left, then
        compact the vocabulary when under ``min_live_share`` of it is live (:meth:`compact`).
        Returns the paths deleted. Call while holding the raw store's lock, as every writer does."""
        staging_names = temporary_path(self.root).name.rsplit("-", 1)[0] + "-*"  # any process's
        leftovers = list(self.root.parent.glob(staging_names))
        for path in leftovers:  # a compaction killed before its exchange: the old generation is in place
            shutil.rmtree(path, ignore_errors=True)
        if not self.root.is_dir():
            return leftovers
        old = [p for p in self.root.glob("date=*.arrow") if date.fromisoformat(p.name[5:15]) < day]
        leftovers += [p for p in self.root.iterdir() if p.name.startswith(".")]
        for path in old + leftovers:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        self.compact(min_live_share=min_live_share)
        return old + leftovers

    def live_ids(self, vocabulary: IdVocabulary) -> np.ndarray:
        """A bool mask over ``vocabulary``'s codes: those some cached file of its generation uses
        (null's code always)."""
        return _live_mask(len(vocabulary), *self._coded_files(vocabulary))

    def compact(self, *, min_live_share: float = MIN_LIVE_SHARE) -> IdVocabulary | None:
        """When under ``min_live_share`` of the stored vocabulary's ids are live (:meth:`live_ids`),
        replace the cache by a new generation: the live ids only, every file of the old generation
        rewritten with its codes remapped (files of another generation, misses anyway, dropped), the
        fraud reports copied, the sorted history dropped. Returns the new vocabulary, or None when it
        left the cache as it was (``min_live_share`` 0: never, without reading the files; nor while
        the newest date file alone uses the share: one footer read). Atomic (the module doc); call
        while holding the raw store's lock."""
        if min_live_share <= 0 or not (self.root / VOCABULARY_FILE).is_file():
            return None
        vocabulary = self.read_vocabulary()
        if self._one_file_live(vocabulary) >= min_live_share * len(vocabulary):
            return None  # a lower bound of the live ids already meets the share: no file need be read
        dated, matched = self._coded_files(vocabulary)
        live = _live_mask(len(vocabulary), dated, matched)
        if live.sum() >= min_live_share * len(vocabulary):
            return None
        compacted, remap = vocabulary.compacted(live)
        with staged_dir(self.root) as staging:
            new = LookbackCache(staging)
            new.write_vocabulary(compacted)
            for day, (table, key) in dated.items():
                new.write_date(day, key, compacted, _remapped(table, remap))
            if matched:
                new.write_matched(_remapped(matched[0], remap), matched[1], compacted)
            if (self.root / FRAUDS_FILE).is_file():
                shutil.copyfile(self.root / FRAUDS_FILE, staging / FRAUDS_FILE)
        return compacted

    def _one_file_live(self, vocabulary: IdVocabulary) -> int:
        """A lower bound of the live ids (:meth:`live_ids`) from the footers alone: the distinct codes
        the newest date file valid under ``vocabulary`` records (null's included), 0 when none does."""
        for path in sorted(self.root.glob("date=*.arrow"), reverse=True):
            try:
                with pa.memory_map(str(path)) as source:
                    schema = pa.ipc.open_file(source).schema
                meta = json.loads(schema.metadata[_META])
            except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
                continue
            if (meta.get("format") == CACHE_FORMAT and meta.get("generation") == vocabulary.generation
                    and meta.get("ids", 1 << 62) <= len(vocabulary) and schema.remove_metadata().equals(CODED_SCHEMA)):
                return int(meta.get("distinct", 0))
        return 0

    def _coded_files(self, vocabulary: IdVocabulary) -> tuple[dict[date, tuple[pa.Table, str]],
                                                              tuple[pa.Table, dict[date, str]] | None]:
        """``({day: (rows, key)}, (matches, keys) or None)``: the date files and the match file whose
        codes hold under ``vocabulary`` (any key: the raw files are not consulted)."""
        dated = {}
        for path in sorted(self.root.glob("date=*.arrow")):
            try:
                meta = json.loads(_read_ipc(path).schema.metadata[_META])
                day = date.fromisoformat(path.name[5:15])
            except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError):
                continue
            rows = self.read_date(day, meta.get("key"), vocabulary)
            if rows is not None:
                dated[day] = (rows, meta["key"])
        try:
            meta = json.loads(_read_ipc(self.root / MATCHED_FILE).schema.metadata[_META])
            keys = {date.fromisoformat(day): key for day, key in meta["keys"].items()}
        except (OSError, pa.ArrowInvalid, KeyError, TypeError, ValueError, AttributeError):
            return dated, None
        rows = self.read_matched(keys, vocabulary)
        return dated, ((rows, keys) if rows.num_rows or keys else None)


def _read_ipc(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _write_ipc(table: pa.Table, path: Path, *, durable: bool) -> None:
    with atomic_path(path, durable=durable) as tmp, pa.OSFile(str(tmp), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)


def _live_mask(size: int, dated: dict[date, tuple[pa.Table, str]], matched: tuple[pa.Table, dict] | None) -> np.ndarray:
    """A bool mask over ``size`` codes: null's and those the coded columns of ``dated``'s and
    ``matched``'s tables use."""
    live = np.zeros(size, dtype=bool)
    live[0] = True
    for table in [table for table, _ in dated.values()] + ([matched[0]] if matched else []):
        for name in CODE_COLUMNS:
            if name in table.column_names:
                live[table.column(name).to_numpy()] = True
    return live


def _distinct_codes(size: int, rows: pa.Table) -> int:
    """How many distinct codes of a ``size``-code vocabulary ``rows``' coded columns use, null's
    counted always (as :func:`_live_mask` does)."""
    used = np.zeros(size, dtype=bool)
    used[0] = True
    for name in CODE_COLUMNS:
        used[rows.column(name).to_numpy()] = True
    return int(used.sum())


def _remapped(table: pa.Table, remap: np.ndarray) -> pa.Table:
    """``table`` with each coded column (:data:`CODE_COLUMNS`) mapped through ``remap``."""
    for name in CODE_COLUMNS:
        if name in table.column_names:
            index = table.schema.get_field_index(name)
            table = table.set_column(index, table.schema.field(index), pa.array(remap[table.column(name).to_numpy()]))
    return table
