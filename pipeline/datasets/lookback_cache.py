"""The lookback cache: each event date's payments as the window kernel reads them, coded once.

A night computes one new date from its payments and those of the 30 days before it. Without the
cache it reads those 31 days of raw Parquet (eight columns, ids as strings) and codes every id again
each night; with it, a date is read from the raw store and coded when a build first needs it, and
later builds load it as integer columns that merge by concatenation.

Layout under the feature table's ``_lookback/`` (:meth:`pipeline.datasets.feature_table.FeatureTable.lookback_cache`)::

    ids.arrow                 # the id vocabulary (IdVocabulary) of card, merchant and country ids
    date=YYYY-MM-DD.arrow     # the date's payments (CODED_SCHEMA), in time order
    .<name>.tmp-<pid>         # a file being written (a killed write leaves only this)

Arrow IPC files, uncompressed and memory-mapped when read: loading a date reads its footer, not its
rows, until the kernel copies the columns it needs.

Validity: a date file's schema metadata names what it was coded from (``key``: the caller's digest
of the date's committed raw files) and the vocabulary its codes need (generation, length).
:meth:`LookbackCache.read_date` returns the rows only when that key equals the key the caller
computes now and the vocabulary is of that generation and at least that long. Anything else is a
miss (late payments: a new raw file, so a new key; a vocabulary started afresh; a file that does not
parse): the caller reads the raw files again and rewrites the date.

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

from pipeline.atomic import atomic_path
from pipeline.datasets.id_vocabulary import IdVocabulary

VOCABULARY_FILE = "ids.arrow"
CACHE_FORMAT = 1  # bump when CODED_SCHEMA or the coding changes: every date file becomes a miss
# A date's payments: ids coded by the vocabulary (card, merchant, country), the event time in epoch
# microseconds; transaction ids kept to match fraud reports to their payments.
CODED_SCHEMA = pa.schema([("transaction_id", pa.string()), ("card", pa.int32()), ("merchant", pa.int32()),
                          ("country", pa.int32()), ("ts_us", pa.int64()), ("amount", pa.float64())])
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
