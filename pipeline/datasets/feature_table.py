"""The feature table: point-in-time feature rows partitioned by event date, each date computed once
and reused by every later build whose inputs for that date are unchanged.

Layout under the table root (``<state>/features/<raw store name>-<store id>`` by default, see
:func:`pipeline.ingest.feature_update.feature_table_root`)::

    date=YYYY-MM-DD/features.parquet    # the date's rows (arrow_kernel.ROW_SCHEMA), no labels
    date=YYYY-MM-DD/fingerprint.json    # {"fingerprint": <sha256 of the date's inputs>, "rows": n, ...}
    .build-<date>-<pid>/                # a partition being written (a killed build leaves only this;
                                        #   Spark executors write the file here, the driver the rest)
    _lookback/                          # coded payments, fraud reports, matches (lookback_cache.py)

A partition is a directory published whole (:func:`pipeline.atomic.publish_dir`): a reader sees the
previous partition or the complete new one, never a Parquet file without its fingerprint or the
reverse. Its fingerprint names its inputs (which raw files and fraud reports it was computed from,
see :mod:`pipeline.ingest.feature_update`); a build trusts a partition only when the fingerprint it
computes for the date equals the stored one. Labels are not stored here: they depend on each
dataset's cutoff and are joined when a dataset is assembled.

Every ``features.parquet`` is written by :func:`write_partition_file`, in the driver (the local
engine) or on a Spark executor (the spark engine): one set of writer settings, so a date's file is
the same bytes whichever engine computed it.

Pyarrow only: the benchmark and tests read partitions without Spark.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import publish_dir
from pipeline.datasets.lookback_cache import LookbackCache

PARTITION_FILE = "features.parquet"
FINGERPRINT_FILE = "fingerprint.json"
LOOKBACK_DIR = "_lookback"
_BUILD_PREFIX = ".build-"
_OLD_PREFIX = ".old-"  # publish_dir's swap-out name of a partition being replaced
# Rows per Parquet row group: what one writer holds before flushing (a Spark task writing a date of
# millions of payments holds one group, a few hundred MB at most), and a reader's unit of work.
ROW_GROUP_ROWS = 1 << 18
PARTITION_COMPRESSION = "zstd"


def write_partition_file(path: Path, tables: Iterable[pa.Table], schema: pa.Schema) -> int:
    """Write ``tables`` (in order, each of ``schema``) as one Parquet file at ``path``; return its rows.

    The one writer of partition files. Row groups hold exactly ``ROW_GROUP_ROWS`` rows (the last
    fewer), each written from contiguous arrays: the bytes depend only on the rows, never on how the
    caller chunked them (a driver's one table, an executor's stream of Arrow batches).
    """
    rows = 0
    pending: list[pa.Table] = []
    pending_rows = 0
    with pq.ParquetWriter(path, schema, compression=PARTITION_COMPRESSION) as writer:
        for table in tables:
            pending.append(table.cast(schema))
            pending_rows += table.num_rows
            while pending_rows >= ROW_GROUP_ROWS:
                whole = pa.concat_tables(pending)
                writer.write_table(whole.slice(0, ROW_GROUP_ROWS).combine_chunks(), row_group_size=ROW_GROUP_ROWS)
                pending, pending_rows = [whole.slice(ROW_GROUP_ROWS)], pending_rows - ROW_GROUP_ROWS
                rows += ROW_GROUP_ROWS
        if pending_rows:
            writer.write_table(pa.concat_tables(pending).combine_chunks(), row_group_size=ROW_GROUP_ROWS)
            rows += pending_rows
    return rows


class FeatureTable:
    """One feature table directory (see the module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def partition_dir(self, day: date) -> Path:
        return self.root / f"date={day.isoformat()}"

    def partition_file(self, day: date) -> Path:
        return self.partition_dir(day) / PARTITION_FILE

    def lookback_cache(self) -> LookbackCache:
        """The coded payments the table's builds read their lookback from (a cache: deleting it costs
        only time)."""
        return LookbackCache(self.root / LOOKBACK_DIR)

    def fingerprint(self, day: date) -> str | None:
        """The published partition's fingerprint; None when the date has no complete partition."""
        path = self.partition_dir(day) / FINGERPRINT_FILE
        try:
            return json.loads(path.read_text())["fingerprint"]
        except (FileNotFoundError, ValueError, KeyError):
            return None

    def staging_dir(self, day: date) -> Path:
        """A fresh, empty directory where this process builds ``day``'s partition (its name is what
        :meth:`discard_leftovers` deletes after a kill)."""
        staging = self.root / f"{_BUILD_PREFIX}{day.isoformat()}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def publish(self, day: date, rows: pa.Table, fingerprint: str, inputs: dict) -> Path:
        """Write ``rows`` as ``day``'s partition with its fingerprint; replaces an older partition
        in one rename. ``inputs``: a readable summary of what the fingerprint covers (counts)."""
        staging = self.staging_dir(day)
        write_partition_file(staging / PARTITION_FILE, [rows], rows.schema)
        return self.publish_staged(day, staging, rows.num_rows, fingerprint, inputs)

    def publish_staged(self, day: date, staging: Path, rows: int, fingerprint: str, inputs: dict) -> Path:
        """Publish ``staging`` (from :meth:`staging_dir`, holding the date's ``PARTITION_FILE`` of
        ``rows`` rows) as ``day``'s partition: adds the fingerprint, then one rename."""
        record = {"fingerprint": fingerprint, "date": day.isoformat(), "rows": rows, "inputs": inputs}
        (staging / FINGERPRINT_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        publish_dir(staging, self.partition_dir(day))  # flushes both files before the rename
        return self.partition_dir(day)

    def discard_leftovers(self) -> list[Path]:
        """Delete what killed builds left: staging directories, and swapped-out old partitions (a
        kill between publish_dir's two renames leaves the date without a partition: it is simply
        computed again). Call while holding the raw store's lock, as every writer does."""
        if not self.root.is_dir():
            return []
        leftovers = [p for p in self.root.iterdir() if p.name.startswith((_BUILD_PREFIX, _OLD_PREFIX))]
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)
        return leftovers

    def read(self, days: list[date]) -> pa.Table:
        """The rows of ``days`` (each must have a partition), concatenated in date order."""
        return pa.concat_tables([pq.read_table(self.partition_file(d)) for d in sorted(days)])
