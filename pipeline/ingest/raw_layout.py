"""The raw store, without Spark: its layout, file schemas, commit-aware listing and its lock.

Layout under the store root (``<state>/raw`` by default)::

    transactions/event_date=YYYY-MM-DD/run_id=<run>/part-*.parquet   # valid transactions
    labels/report_date=YYYY-MM-DD/run_id=<run>/part-*.parquet         # valid labels
    quarantine/run_id=<run>/<kind>-*.parquet                          # refused records, raw bytes kept
    _runs/<run>.json                                                  # run manifest (accounting, ranges)
    _state/offsets.json                                               # commit log (see offsets.py)
    _state/lock                                                       # one writer at a time
    _state/store.json                                                 # the store's id (RawStore.store_id)
    _state/run_hashes/run_id=<run>/<kind>-*.parquet                   # a landing run's row hashes (see below)
    _state/run_hashes/run_id=<run>/<kind>-*.probe.npy                 # ... their identities sorted (store_copies.py)
    _index/<table>/<runs>/bucket-XX.npy                               # identity index (see id_index.py)

Each read task also writes, beside its files, the hashes of the rows it left valid or late, in its
files' row order (:func:`run_hashes_arrow_schema`), and their identities sorted into a probe: the
identity index is looked up from the probes shard by shard (:mod:`pipeline.ingest.store_copies`) and
the driver finds the run's copies from the hashes without reading the landed rows back
(:mod:`pipeline.ingest.run_copies`). They serve one run only:
deleted after its commit, and with every uncommitted run's files.

Raw rows carry their Kafka position and key, the typed contract fields and ``payload``, the
record's original JSON text (unknown fields included). Append-only: a run only adds ``run_id=<run>``
directories (written by the read tasks, see :mod:`pipeline.ingest.landing`). They become visible
when the run id enters the commit log, after all of them are complete; readers filter on
committed run ids, so a run killed at any point leaves nothing visible, and the next run deletes
its leftovers first. The store must sit on a filesystem the driver and the executors share
(local disk in ``local``/``local-cluster`` mode, a mounted volume on a cluster).

This module needs pyarrow only. It lists committed files with their partitions
(:meth:`RawStore.committed_raw_files`, the path rule once in :func:`raw_partitioning`); the store's
Arrow reader is :mod:`pipeline.ingest.raw_reader`, Spark's readers are :mod:`pipeline.ingest.raw_store`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path, write_json_atomic
from pipeline.contract import FIELDS_BY_KIND, Kind
from pipeline.file_lock import LockHeld, file_lock
from pipeline.ingest.id_index import INDEX_DIR, IdIndex
from pipeline.ingest.validate import DETAIL, FIELD, REASON, SPARK_TYPES

TABLE_BY_KIND = {Kind.TRANSACTION: "transactions", Kind.LABEL: "labels"}
DATE_COLUMN_BY_KIND = {Kind.TRANSACTION: "event_date", Kind.LABEL: "report_date"}
PAYLOAD = "payload"
QUARANTINE = "quarantine"
RUN_ID = "run_id"
POSITION = ("topic", "partition", "offset")
RUN_HASHES = "_state/run_hashes"
STORE_FILE = "_state/store.json"  # {"store_id": <uuid4>, "root": <resolved path the store was last used at>}

log = logging.getLogger(__name__)

_ARROW = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
          "boolean": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32(), "binary": pa.binary()}


class IngestLocked(LockHeld):
    """Another ingest run holds the raw store's lock."""


class StoreFileUnreadable(RuntimeError):
    """The store's ``_state/store.json`` is not what :meth:`RawStore.store_id` wrote."""


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


# One row per record a read task left valid or late: its 128-bit identity and 64-bit content hashes
# (pipeline.ingest.identity, as int64), Kafka time and position, and where it went: ``late`` rows
# are in the task's quarantine file (among its other refused rows), the others in the raw file of
# their ``day`` (the event time's or report time's date). Row order is the task's, so the n-th row
# of a (task, day) is its raw file's n-th row.
RUN_HASH_COLUMNS = [("id_h1", "long"), ("id_h2", "long"), ("content_hash", "long"), ("kafka_timestamp", "timestamp"),
                    ("partition", "int"), ("offset", "long"), ("day", "date"), ("late", "boolean")]


def run_hashes_arrow_schema() -> pa.Schema:
    return pa.schema([(n, _ARROW[t]) for n, t in RUN_HASH_COLUMNS])


def raw_arrow_schema(kind: Kind) -> pa.Schema:
    """Columns of a raw Parquet file (partition columns live in the path)."""
    return pa.schema([(n, _ARROW[t]) for n, t in file_columns(kind)])


def quarantine_arrow_schema() -> pa.Schema:
    return pa.schema([(n, _ARROW[t]) for n, t in QUARANTINE_COLUMNS])


@cache
def raw_partitioning(kind: Kind) -> pads.Partitioning:
    """How a raw file's path under its table names its partition: ``<date column>=<day>/run_id=<run>``
    (hive), the day a ``date32``. The one definition: listings parse paths with it and Arrow's
    datasets add the partition columns with it."""
    return pads.partitioning(pa.schema([(DATE_COLUMN_BY_KIND[kind], pa.date32()), (RUN_ID, pa.string())]),
                             flavor="hive")


@dataclass(frozen=True)
class RawFile:
    """A raw file and the partition its path names (:func:`raw_partitioning`)."""

    path: Path
    day: date
    run_id: str


def run_partition(kind: Kind, table_root: Path, run_dir: Path) -> tuple[date, str]:
    """``(day, run id)`` of a run directory ``<table_root>/<date column>=<day>/run_id=<run>``."""
    # The trailing "/": parse takes the last segment for a file name and drops it.
    keys = pads.get_partition_keys(raw_partitioning(kind).parse(f"{run_dir.relative_to(table_root).as_posix()}/"))
    return keys[DATE_COLUMN_BY_KIND[kind]], keys[RUN_ID]


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
        self._store_id: str | None = None  # store_id(), once read (a night asks three times)

    def table_path(self, kind: Kind) -> Path:
        return self.root / TABLE_BY_KIND[kind]

    @contextmanager
    def locked(self) -> Iterator[RawStore]:
        """Hold the store's exclusive lock (released by the OS even if the process is killed);
        raises :class:`IngestLocked`, naming the holder, when another run holds it."""
        with file_lock(self.root / "_state" / "lock", error=IngestLocked,
                       user=f"another ingest run is using {self.root}"):
            yield self

    def committed(self):
        return self.offsets.load()

    def store_id(self) -> str:
        """The store's identity: a random id made once, on first use, and kept for the store's life
        (what its feature table is keyed by). Call with the lock held: it may write ``store.json``.

        The file also records the path the store was last used at, which tells apart finding it
        elsewhere: the same directory by another path (a symlink, a bind mount) changes nothing; a
        moved or renamed store (nothing at the recorded path, or another store) keeps its id; a copy
        (the recorded path still holds a store with this id) is another store and gets a new id.
        Limit: a copy whose original has moved too before either is used again looks moved as well,
        and both keep the id; delete the copy's ``store.json`` to make it another store.
        """
        if self._store_id is None:
            self._store_id = self._settle_store_id()
        return self._store_id

    def _settle_store_id(self) -> str:
        """:meth:`store_id` read from ``store.json``, or made, and written back (the rules are :meth:`store_id`'s)."""
        path, here = self.root / STORE_FILE, self.root.resolve()
        recorded = _read_store_file(path)
        if recorded is None:
            store_id = uuid.uuid4().hex
        else:
            store_id, home = recorded["store_id"], Path(recorded["root"])
            if home == here or (home.is_dir() and os.path.samefile(home, here)):
                return store_id
            if _id_at(home) == store_id:
                log.warning("%s is a copy of the raw store at %s: it gets its own id (and feature table)", here, home)
                store_id = uuid.uuid4().hex
            else:
                log.warning("the raw store at %s was moved from %s: it keeps its id and feature table", here, home)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"store_id": store_id, "root": str(here)})
        return store_id

    def id_index(self, kind: Kind, segments: list[str] | None = None) -> IdIndex:
        """The identity index of ``kind`` with the committed segments (or ``segments``)."""
        live = segments if segments is not None else (self.committed().index or {}).get(TABLE_BY_KIND[kind], [])
        return IdIndex(self.root / INDEX_DIR / TABLE_BY_KIND[kind], live)

    def discard_uncommitted(self) -> list[Path]:
        """Delete files of runs that never committed (killed runs) and index segments the commit
        log does not list. Call with the lock held."""
        runs = set(self.committed().runs)
        removed = [p for kind in TABLE_BY_KIND for p in self.id_index(kind).discard_unlisted()]
        # Row hashes serve their own run only: a committed run's were left by a kill after its commit.
        removed += [p for p in (self.root / RUN_HASHES).glob(f"{RUN_ID}=*") if p.is_dir()]
        for table in [*TABLE_BY_KIND.values(), QUARANTINE]:
            base = self.root / table
            if base.is_dir():
                removed += [p for p in base.glob(f"**/{RUN_ID}=*") if p.is_dir() and p.name.split("=", 1)[1] not in runs]
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed

    def latest_date(self, kind: Kind) -> date | None:
        """Latest partition date holding committed rows (from the directory listing, no Spark job)."""
        return max((day for day, _ in self._committed_run_dirs(kind).values()), default=None)

    def committed_raw_files(self, kind: Kind) -> list[RawFile]:
        """Raw files of ``kind`` from committed runs with their partitions, in path order: the
        directory listing filtered by the commit log, so files of a killed or running run (in the
        same date directories) are never among them. What every reader of the store starts from."""
        dirs = self._committed_run_dirs(kind)
        return [RawFile(p, *dirs[p.parent]) for p in sorted(p for d in dirs for p in d.glob("*.parquet"))]

    def _committed_run_dirs(self, kind: Kind) -> dict[Path, tuple[date, str]]:
        """``run directory -> (day, run id)`` of the committed runs' directories of ``kind``."""
        runs, table = set(self.committed().runs), self.table_path(kind)
        dirs = {d: run_partition(kind, table, d) for d in table.glob(f"{DATE_COLUMN_BY_KIND[kind]}=*/{RUN_ID}=*")}
        return {d: partition for d, partition in dirs.items() if partition[1] in runs}

    def committed_files(self, kind: Kind) -> list[Path]:
        """Raw files of ``kind`` from committed runs."""
        return [f.path for f in self.committed_raw_files(kind)]

    def committed_rows_by_date(self, kind: Kind, start: date, end: date) -> dict[date, int]:
        """Rows of committed runs per partition date in ``[start, end]``, from the Parquet footers
        (no Spark job, no data read)."""
        rows: dict[date, int] = {}
        for f in self.committed_raw_files(kind):
            if start <= f.day <= end:
                rows[f.day] = rows.get(f.day, 0) + pq.ParquetFile(f.path).metadata.num_rows
        return rows

    def run_files(self, run_id: str, kind: Kind) -> tuple[list[Path], list[Path]]:
        """``(raw files, quarantine files)`` of ``kind`` that run ``run_id`` wrote."""
        raw = sorted(self.table_path(kind).glob(f"*/{RUN_ID}={run_id}/*.parquet"))
        quarantine = sorted((self.root / QUARANTINE / f"{RUN_ID}={run_id}").glob(f"{kind.value}-*.parquet"))
        return raw, quarantine

    def run_hash_files(self, run_id: str, kind: Kind) -> list[Path]:
        """The row hashes of ``kind`` that run ``run_id``'s read tasks wrote, one file per task."""
        return sorted((self.root / RUN_HASHES / f"{RUN_ID}={run_id}").glob(f"{kind.value}-*.parquet"))

    def discard_run_hashes(self, run_id: str) -> None:
        """Delete run ``run_id``'s row hashes (once it committed, nothing reads them)."""
        shutil.rmtree(self.root / RUN_HASHES / f"{RUN_ID}={run_id}", ignore_errors=True)

    def count_run_rows(self, run_id: str, kind: Kind) -> tuple[int, int]:
        """``(raw rows, quarantine rows)`` of ``kind`` in run ``run_id``'s files (Parquet footers)."""
        raw, quarantine = self.run_files(run_id, kind)
        rows = lambda files: sum(pq.ParquetFile(f).metadata.num_rows for f in files)  # noqa: E731
        return rows(raw), rows(quarantine)

    def write_run_manifest(self, run_id: str, manifest: dict) -> Path:
        path = self.root / "_runs" / f"{run_id}.json"
        write_json_atomic(path, manifest)
        return path


def _read_store_file(path: Path) -> dict | None:
    """``store.json``'s content, None when there is none."""
    try:
        recorded = json.loads(path.read_text())
        return {"store_id": str(recorded["store_id"]), "root": str(recorded["root"])}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreFileUnreadable(f"{path} is unreadable ({type(exc).__name__}: {exc}); restore it from a backup, "
                                  "or delete it: the store then gets a new id and its features are computed "
                                  "again into a new table") from exc


def _id_at(root: Path) -> str | None:
    """The id of the store at ``root``, None when there is none or it cannot be read."""
    try:
        return (_read_store_file(root / STORE_FILE) or {}).get("store_id")
    except StoreFileUnreadable:
        return None
