"""Dataset shards: plain Parquet files a trainer reads with pyarrow, byte-identical on rerun.

Each (date, shard) group is written by one executor task with pyarrow: rows sorted by
``(event_time, transaction_id)``, cast to :data:`SHARD_SCHEMA`, zstd-compressed. Same rows in,
same bytes out, so the manifest's content hash (over shard SHA-256s) is reproducible.
A row's shard is ``crc32(transaction_id) mod num_shards``: stable across runs and date ranges.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.datasets.layout import shard_relpath
from pipeline.datasets.manifest import ID_COLUMNS, LABEL_COLUMN, REPORTED_AT_COLUMN, ShardInfo
from pipeline.features.definitions import CATEGORICAL_FEATURES, NUMERIC_FEATURES

SHARD_SCHEMA = pa.schema(
    [("transaction_id", pa.string()), ("card_id", pa.string()), ("event_time", pa.timestamp("us", tz="UTC"))]
    + [(name, pa.float64()) for name in NUMERIC_FEATURES]
    + [(name, pa.int32()) for name in CATEGORICAL_FEATURES]
    + [(LABEL_COLUMN, pa.int32()), (REPORTED_AT_COLUMN, pa.timestamp("us", tz="UTC"))]
)
assert tuple(SHARD_SCHEMA.names[:3]) == ID_COLUMNS
RESULT_DDL = "date string, shard int, rows long, frauds long, sha256 string"
DATE = "_date"
SHARD = "_shard"


def shard_index(transaction_id: Column, num_shards: int) -> Column:
    return F.pmod(F.crc32(transaction_id.cast("binary")), F.lit(num_shards)).cast("int")


def write_shard_file(table: pa.Table, path: Path) -> tuple[int, int, str]:
    """Write one shard deterministically; returns ``(rows, frauds, sha256)``."""
    table = table.select(SHARD_SCHEMA.names).cast(SHARD_SCHEMA)
    table = table.sort_by([("event_time", "ascending"), ("transaction_id", "ascending")])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    frauds = int(pc.sum(table[LABEL_COLUMN]).as_py() or 0)
    return table.num_rows, frauds, digest


def write_shards(rows: DataFrame, out_dir: Path, num_shards: int) -> list[ShardInfo]:
    """Write ``rows`` (``SHARD_SCHEMA`` columns plus ``event_date``) as shards under ``out_dir``.

    Runs on the executors (``applyInArrow``, one task per non-empty shard). Returned paths are
    relative to ``out_dir``.
    """
    target = str(out_dir)

    def write_group(table: pa.Table) -> pa.Table:
        day, shard = table[DATE][0].as_py(), table[SHARD][0].as_py()
        n, frauds, digest = write_shard_file(table, Path(target) / shard_relpath(day, shard))
        return pa.table({"date": [day], "shard": pa.array([shard], pa.int32()), "rows": [n], "frauds": [frauds],
                         "sha256": [digest]})

    grouped = (rows.withColumn(DATE, F.date_format("event_date", "yyyy-MM-dd"))
               .withColumn(SHARD, shard_index(F.col("transaction_id"), num_shards))
               .select(*SHARD_SCHEMA.names, DATE, SHARD))
    results = grouped.groupBy(DATE, SHARD).applyInArrow(write_group, RESULT_DDL).collect()
    return [ShardInfo(shard_relpath(r["date"], r["shard"]), r["date"], r["shard"], r["rows"], r["frauds"], r["sha256"])
            for r in results]


def write_empty_shards(out_dir: Path, days: list[str], num_shards: int, written: list[ShardInfo]) -> list[ShardInfo]:
    """Schema-only files for the (date, shard) slots no row fell into: every date has all shards."""
    have = {(s.date, s.shard) for s in written}
    empty = SHARD_SCHEMA.empty_table()
    out = []
    for day in days:
        for shard in range(num_shards):
            if (day, shard) not in have:
                _, _, digest = write_shard_file(empty, out_dir / shard_relpath(day, shard))
                out.append(ShardInfo(shard_relpath(day, shard), day, shard, 0, 0, digest))
    return out
