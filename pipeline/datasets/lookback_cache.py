"""The lookback cache: each event date's payments as the window kernel reads them, coded once.

A night computes one new date from its payments and those of the 30 days before it. Without the
cache it reads those 31 days of raw Parquet (eight columns, ids as strings) and codes every id again
each night; with it, a date is read from the raw store and coded when a build first needs it, and
later builds load it as integer columns that merge by concatenation.

Layout under the feature table's ``_lookback/`` (:meth:`pipeline.datasets.feature_table.FeatureTable.lookback_cache`)::

    ids.arrow                 # the id vocabulary (IdVocabulary) of card, merchant and country ids
    date=YYYY-MM-DD.arrow     # the date's payments (CODED_SCHEMA), in time order
    frauds.arrow              # the fraud reports of each report date (FRAUD_SCHEMA)
    fraud_payments.arrow      # the payments fraud reports were matched to (MATCHED_SCHEMA)
    .<name>.tmp-<pid>         # a file being written (a killed write leaves only this)

The two fraud files spare a night what grows with history rather than with the new day: reading
some sixty days of label files, and matching that window's reports against the payments of every
date they name (a string probe per payment, ~1M payments on the dev layout). With them a night
reads the new report date's files and matches only the reports it has not matched before.

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
that uses its new codes, so no date file can outlive the codes it refers to. Date files skip the
fsync: one lost to a power cut is a miss, never a wrong code. Writers hold the raw store's lock.
"""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.atomic import atomic_path
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
FRAUDS_FILE = "frauds.arrow"
MATCHED_FILE = "fraud_payments.arrow"
_EPOCH = date(1970, 1, 1)
_META = b"lookback"


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
        meta = {"format": CACHE_FORMAT, "key": key, "generation": vocabulary.generation, "ids": len(vocabulary)}
        rows = rows.cast(CODED_SCHEMA).replace_schema_metadata({_META: json.dumps(meta)})
        _write_ipc(rows, self.date_file(day), durable=False)

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

    def discard_before(self, day: date) -> list[Path]:
        """Delete the date files before ``day`` and what killed writes left. Call while holding the raw
        store's lock, as every writer does."""
        if not self.root.is_dir():
            return []
        old = [p for p in self.root.glob("date=*.arrow") if date.fromisoformat(p.name[5:15]) < day]
        leftovers = [p for p in self.root.iterdir() if p.name.startswith(".")]
        for path in old + leftovers:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return old + leftovers


def _read_ipc(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _write_ipc(table: pa.Table, path: Path, *, durable: bool) -> None:
    with atomic_path(path, durable=durable) as tmp, pa.OSFile(str(tmp), "wb") as sink:
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
