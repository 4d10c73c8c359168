"""The raw store, without Spark: its layout, file schemas, commit-aware listing and its lock.

Layout under the store root (``<state>/raw`` by default)::

    transactions/event_date=YYYY-MM-DD/run_id=<run>/part-*.parquet   # valid transactions
    labels/report_date=YYYY-MM-DD/run_id=<run>/part-*.parquet         # valid labels
    quarantine/run_id=<run>/<kind>-*.parquet                          # refused records, raw bytes kept
    _runs/<run>.json                                                  # run manifest (accounting, ranges)
    _state/offsets.json                                               # commit log (see offsets.py)
    _state/lock                                                       # one writer at a time
    _index/<table>/<runs>/bucket-XX.npy                               # identity index (see id_index.py)

Raw rows carry their Kafka position and key, the typed contract fields and ``payload``, the
record's original JSON text (unknown fields included). Append-only: a run only adds ``run_id=<run>``
directories (written by the read tasks, see :mod:`pipeline.ingest.landing`). They become visible
when the run id enters the commit log, after all of them are complete; readers filter on
committed run ids, so a run killed at any point leaves nothing visible, and the next run deletes
its leftovers first. The store must sit on a filesystem the driver and the executors share
(local disk in ``local``/``local-cluster`` mode, a mounted volume on a cluster).

This module needs pyarrow only: the scoring service and the monitor list and read committed files
with Arrow. Spark's readers of the same tables are :mod:`pipeline.ingest.raw_store`.
"""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path, write_json_atomic
from pipeline.contract import FIELDS_BY_KIND, Kind
from pipeline.ingest.id_index import INDEX_DIR, IdIndex
from pipeline.ingest.validate import DETAIL, FIELD, REASON, SPARK_TYPES

TABLE_BY_KIND = {Kind.TRANSACTION: "transactions", Kind.LABEL: "labels"}
DATE_COLUMN_BY_KIND = {Kind.TRANSACTION: "event_date", Kind.LABEL: "report_date"}
PAYLOAD = "payload"
QUARANTINE = "quarantine"
RUN_ID = "run_id"
POSITION = ("topic", "partition", "offset")

_ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
          "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32(), "binary": pa.binary()}


class IngestLocked(RuntimeError):
    """Another ingest run holds the raw store's lock."""


def file_columns(kind: Kind) -> list[tuple[str, str]]:
    """``(name, type)`` of a raw file's columns, types by their Spark names (``int``, ``long``, ...)."""
    columns = [("topic", "string"), ("partition", "int"), ("offset", "long"), ("kafka_timestamp", "timestamp"),
               ("key", "binary")]
    return columns + [(s.name, SPARK_TYPES[s.json_type]) for s in FIELDS_BY_KIND[kind]] + [(PAYLOAD, "string")]


# The last three are set for records the contract accepted (refused for their timing, or copies):
# the record's transaction_id, and its identity and content hashes (pipeline.ingest.identity) as int64.
QUARANTINE_COLUMNS = [("kind", "string"), ("topic", "string"), ("partition", "int"), ("offset", "long"),
                       ("kafka_timestamp", "timestamp"), ("key", "binary"), ("value", "binary"),
                       (REASON, "string"), (FIELD, "string"), (DETAIL, "string"),
                       ("transaction_id", "string"), ("id_hash", "long"), ("content_hash", "long")]


def raw_arrow_schema(kind: Kind) -> pa.Schema:
    """Columns of a raw Parquet file (partition columns live in the path)."""
    return pa.schema([(n, _ARROW[t]) for n, t in file_columns(kind)])


def quarantine_arrow_schema() -> pa.Schema:
    return pa.schema([(n, _ARROW[t]) for n, t in QUARANTINE_COLUMNS])


def write_table_atomic(table: pa.Table, path: Path) -> None:
    """A Parquet file replaced atomically (zstd, as every raw and quarantine file)."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


class RawStore:
    """One raw store directory (see module doc)."""

    def __init__(self, root: Path) -> None:
        from pipeline.ingest.offsets import OffsetStore  # offsets imports nothing from here; keep it one-way

        self.root = Path(root)
        self.offsets = OffsetStore(self.root)

    def table_path(self, kind: Kind) -> Path:
        return self.root / TABLE_BY_KIND[kind]

    @contextmanager
    def locked(self) -> Iterator[RawStore]:
        """Hold the store's exclusive lock (released by the OS even if the process is killed)."""
        lock_path = self.root / "_state" / "lock"
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise IngestLocked(f"another ingest run is using {self.root} (lock {lock_path}); "
                                   f"wait for it to finish") from None
            yield self

    def committed(self):
        return self.offsets.load()

    def id_index(self, kind: Kind, segments: list[str] | None = None) -> IdIndex:
        """The identity index of ``kind`` with the committed segments (or ``segments``)."""
        live = segments if segments is not None else (self.committed().index or {}).get(TABLE_BY_KIND[kind], [])
        return IdIndex(self.root / INDEX_DIR / TABLE_BY_KIND[kind], live)

    def discard_uncommitted(self) -> list[Path]:
        """Delete files of runs that never committed (killed runs) and index segments the commit
        log does not list. Call with the lock held."""
        runs = set(self.committed().runs)
        removed = [p for kind in TABLE_BY_KIND for p in self.id_index(kind).discard_unlisted()]
        for table in [*TABLE_BY_KIND.values(), QUARANTINE]:
            base = self.root / table
            if base.is_dir():
                removed += [p for p in base.glob(f"**/{RUN_ID}=*") if p.is_dir() and p.name.split("=", 1)[1] not in runs]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def latest_date(self, kind: Kind) -> date | None:
        """Latest partition date holding committed rows (from the directory listing, no Spark job)."""
        runs = set(self.committed().runs)
        dates = [p.parent.name.split("=", 1)[1] for p in self.table_path(kind).glob(f"*/{RUN_ID}=*")
                 if p.name.split("=", 1)[1] in runs]
        return date.fromisoformat(max(dates)) if dates else None

    def committed_files(self, kind: Kind) -> list[Path]:
        """Raw files of ``kind`` from committed runs."""
        runs = set(self.committed().runs)
        return sorted(p for p in self.table_path(kind).glob(f"*/{RUN_ID}=*/*.parquet")
                      if p.parent.name.split("=", 1)[1] in runs)

    def committed_rows_by_date(self, kind: Kind, start: date, end: date) -> dict[date, int]:
        """Rows of committed runs per partition date in ``[start, end]``, from the Parquet footers
        (no Spark job, no data read)."""
        rows: dict[date, int] = {}
        for path in self.committed_files(kind):  # <table>/<date column>=<day>/run_id=<run>/<file>
            day = date.fromisoformat(path.parent.parent.name.split("=", 1)[1])
            if start <= day <= end:
                rows[day] = rows.get(day, 0) + pq.ParquetFile(path).metadata.num_rows
        return rows

    def run_files(self, run_id: str, kind: Kind) -> tuple[list[Path], list[Path]]:
        """``(raw files, quarantine files)`` of ``kind`` that run ``run_id`` wrote."""
        raw = sorted(self.table_path(kind).glob(f"*/{RUN_ID}={run_id}/*.parquet"))
        quarantine = sorted((self.root / QUARANTINE / f"{RUN_ID}={run_id}").glob(f"{kind.value}-*.parquet"))
        return raw, quarantine

    def count_run_rows(self, run_id: str, kind: Kind) -> tuple[int, int]:
        """``(raw rows, quarantine rows)`` of ``kind`` in run ``run_id``'s files (Parquet footers)."""
        raw, quarantine = self.run_files(run_id, kind)
        rows = lambda files: sum(pq.ParquetFile(f).metadata.num_rows for f in files)  # noqa: E731
        return rows(raw), rows(quarantine)

    def write_run_manifest(self, run_id: str, manifest: dict) -> Path:
        path = self.root / "_runs" / f"{run_id}.json"
        write_json_atomic(path, manifest)
        return path
