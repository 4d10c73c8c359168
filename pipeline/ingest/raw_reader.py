"""The raw store's Arrow reader: committed rows of a raw table, with their partition date and run.

Every reader outside Spark (feature inputs, the identity index build, the scoring service's seed,
its consistency check, the monitor) reads the store here. What it reads is always the commit log's
file list (:meth:`pipeline.ingest.raw_layout.RawStore.committed_raw_files`), never a directory
scan: a killed or running run leaves files in the same date directories that no reader may see.
Partition columns come from the path through the store's own hive partitioning
(:func:`~pipeline.ingest.raw_layout.raw_partitioning`); the file columns have the raw schema
(:func:`~pipeline.ingest.raw_layout.raw_arrow_schema`), so an empty read is typed too.

Pyarrow only (no Spark session): the scoring service and the monitor import it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from pipeline.contract import Kind
from pipeline.ingest.raw_layout import RawStore, raw_arrow_schema, raw_partitioning


def committed_files_by_date(store: RawStore, kind: Kind) -> dict[date, list[Path]]:
    """Committed raw files of ``kind`` per partition date (a directory listing, nothing read)."""
    by_date: dict[date, list[Path]] = defaultdict(list)
    for f in store.committed_raw_files(kind):
        by_date[f.day].append(f.path)
    return dict(by_date)


def raw_dataset(store: RawStore, kind: Kind, since: date | None = None, until: date | None = None) -> pads.Dataset:
    """The committed files of ``kind`` dated ``since`` .. ``until`` (inclusive; None: open) as one
    Arrow dataset: the raw file columns, then the partition's date column
    (``event_date``/``report_date``, ``date32``) and ``run_id``. Rows in file order."""
    files = [str(f.path) for f in store.committed_raw_files(kind)
             if (since is None or since <= f.day) and (until is None or f.day <= until)]
    partitioning = raw_partitioning(kind)
    schema = pa.unify_schemas([raw_arrow_schema(kind), partitioning.schema])
    return pads.dataset(files, schema=schema, format="parquet", partitioning=partitioning,
                        partition_base_dir=str(store.table_path(kind)))


def read_raw(store: RawStore, kind: Kind, columns: list[str] | tuple[str, ...], since: date | None = None,
             until: date | None = None) -> pa.Table:
    """``columns`` (file or partition columns) of the committed rows of ``kind`` dated ``since`` ..
    ``until`` (see :func:`raw_dataset`)."""
    return raw_dataset(store, kind, since, until).to_table(columns=list(columns))


def read_files(files: list[Path], kind: Kind, columns: list[str] | tuple[str, ...]) -> pa.Table:
    """File ``columns`` of the raw ``files`` of ``kind`` (taken from :func:`committed_files_by_date`
    or :meth:`~pipeline.ingest.raw_layout.RawStore.committed_raw_files`), concatenated in order;
    typed even when there are none."""
    schema = raw_arrow_schema(kind)
    # ParquetFile, not a dataset: setting one up per call costs twice the read of a small file (a
    # night reads some sixty dates of labels, a few hundred rows each, a date at a time).
    tables = [_read_parquet(f, list(columns)) for f in files]
    return pa.concat_tables(tables) if tables else pa.schema([schema.field(c) for c in columns]).empty_table()


def _read_parquet(path: Path, columns: list[str]) -> pa.Table:
    with pq.ParquetFile(path) as source:
        return source.read(columns=columns, use_threads=False)
