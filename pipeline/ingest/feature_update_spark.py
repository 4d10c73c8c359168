"""The feature table's spark engine: a night's stale dates computed and written by Spark executors.

The driver decides what to compute exactly as the local engine does (fingerprints, stale dates:
:func:`pipeline.ingest.feature_update.update_feature_table`) and hands Spark only metadata: the
committed raw files of the dates to read, the plan's fraud reports usable in their windows (ids,
report times, the dates the identity index places their payments on) and one staging directory
per stale date. On the executors:

1. read: each raw file by one task, with the raw store's Arrow reader; the stale dates' payments
   whole (the queries), the other dates of their 30-day lookbacks in the few columns the kernel
   counts (``spark_kernel.CARD_HISTORY``), the located dates' payments in three columns, joined to
   the reports (broadcast) into the instants merchants' frauds became usable: the twin of the local
   engine's :func:`~pipeline.ingest.feature_inputs.fraud_known`, over the same reports;
2. compute: :func:`pipeline.features.spark_kernel.apply_feature_kernel`, the kernel the full Spark
   build runs (same values), hot keys split into time chunks above ``hot_key_rows`` queries;
3. write: rows partitioned by event date, sorted as the local engine orders a date (event time,
   ties in raw file order: the date's files in commit order, each file's rows in file order), each
   date's ``features.parquet`` written by one task into its staging directory with
   :func:`~pipeline.datasets.feature_table.write_partition_file`, the local engine's writer.

The driver then receives one ``(date, rows)`` pair per date, writes each fingerprint and publishes
each date whole (:meth:`FeatureTable.publish_staged`). It never holds payments or feature rows: its
memory is the plan's fraud reports and file lists. A failed job leaves every partition as it was
(staging directories are deleted; a killed driver leaves them to ``discard_leftovers``).

The table root must be on a filesystem the executors share with the driver, as the raw store is.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from functools import partial
from itertools import groupby
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.contract import Kind
from pipeline.datasets.feature_table import PARTITION_FILE, FeatureTable, write_partition_file
from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import ROW_SCHEMA, epoch_us
from pipeline.features.kernel import US_PER_DAY
from pipeline.features.params import FeatureParams
from pipeline.features.spark_kernel import (
    CARD_HISTORY,
    PASSTHROUGH,
    TS_US,
    KernelCallStats,
    apply_feature_kernel,
)
from pipeline.ingest.feature_inputs import FraudReports
from pipeline.ingest.id_index import EPOCH
from pipeline.ingest.raw_reader import read_files

LOOKBACK = timedelta(days=fd.LOOKBACK_DAYS)
SEQ = "_seq"  # a payment's place among its date's raw rows: file index << 32 | row in file
_TYPES = {"transaction_id": "string", "card_id": "string", "merchant_id": "string", TS_US: "bigint",
          "amount": "double", "mcc": "string", "channel": "string", "country": "string", SEQ: "bigint"}
_ARROW = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64()}
_WRITTEN_DDL = "day int, rows bigint"


@dataclass(frozen=True)
class SparkFeatureRun:
    """What the Spark job did: per stale date its staging directory (holding the date's
    ``features.parquet``) and rows, per kernel pass ``[calls, rows, groups, most rows of one
    group in one call]``, a group being a key or a hot key's chunk (:class:`KernelCallStats`), and
    the shuffle partitions each pass ran with (:func:`night_partitions`)."""

    staged: dict[date, tuple[Path, int]]
    kernel_calls: dict[str, list[int]]
    shuffle_partitions: int


def _read_task(batches: Iterator[pa.RecordBatch], columns: tuple[str, ...]) -> Iterator[pa.RecordBatch]:
    """mapInArrow over ``(path, file)`` rows: each raw file's ``columns`` (``_ts_us`` from
    ``event_time``, ``_seq`` from the file index and row)."""
    raw = [c for c in columns if c not in (TS_US, SEQ)] + (["event_time"] if TS_US in columns else [])
    schema = pa.schema([(c, _ARROW[_TYPES[c]]) for c in columns])
    for batch in batches:
        for path, file in zip(batch.column("path").to_pylist(), batch.column("file").to_pylist(), strict=True):
            table = read_files([Path(path)], Kind.TRANSACTION, raw)
            arrays = []
            for name in columns:
                if name == TS_US:
                    arrays.append(pa.array(epoch_us(table.column("event_time")), pa.int64()))
                elif name == SEQ:
                    arrays.append(pa.array((file << 32) + np.arange(table.num_rows, dtype=np.int64), pa.int64()))
                else:
                    arrays.append(table.column(name).combine_chunks().cast(schema.field(name).type))
            yield from pa.Table.from_arrays(arrays, schema=schema).to_batches()


def read_payments(spark: SparkSession, files: dict[date, list[Path]], columns: tuple[str, ...]) -> DataFrame:
    """The payments of the raw ``files`` (per date, in commit order) as ``columns``, one read task
    per file (lazy; the driver sends only the paths)."""
    listed = [(str(path), i) for day in sorted(files) for i, path in enumerate(files[day])]
    paths = spark.createDataFrame(listed, "path string, file bigint")
    if listed:
        paths = paths.repartition(len(listed))
    ddl = ", ".join(f"`{c}` {_TYPES[c]}" for c in columns)
    return paths.mapInArrow(partial(_read_task, columns=columns), ddl)


def fraud_known_instants(spark: SparkSession, files: dict[date, list[Path]], reports: FraudReports,
                         picked: np.ndarray, params: FeatureParams) -> DataFrame:
    """``merchant_id, _ts_us``: when the frauds of reports ``picked`` became usable, for those whose
    payment lies on the date the identity index places it and happened at most
    ``label_match_days`` before the report (the local engine's :func:`fraud_known`, on executors)."""
    asked = pa.table({"transaction_id": reports.transaction_id.take(pa.array(picked, pa.int64())),
                      "_reported_us": pa.array(reports.reported_us[picked], pa.int64())})
    located = {EPOCH + timedelta(days=int(d)) for d in np.unique(reports.day[picked])} & files.keys()
    payments = read_payments(spark, {d: files[d] for d in located}, ("transaction_id", "merchant_id", TS_US))
    match_us = params.label_match_days * US_PER_DAY
    return (payments.join(F.broadcast(spark.createDataFrame(asked)), "transaction_id")
            .filter(F.col(TS_US) >= F.col("_reported_us") - match_us)
            .select("merchant_id", (F.col("_reported_us") + params.label_delay_us).alias(TS_US)))


def _row_table(rows: pa.Table) -> pa.Table:
    """Card-pass output as :data:`ROW_SCHEMA` rows, built as :func:`arrow_kernel.feature_rows` does."""
    ts = rows.column(TS_US).to_numpy().astype(np.int64, copy=False)
    arrays = [rows.column("transaction_id"), rows.column("card_id"),
              pa.array(ts, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
              pa.array(np.floor_divide(ts, US_PER_DAY).astype(np.int32), pa.int32()).cast(pa.date32())]
    arrays += [rows.column(name) for name in fd.FEATURE_COLUMNS]
    return pa.Table.from_arrays(arrays, schema=ROW_SCHEMA)


def _day_runs(batches: Iterator[pa.RecordBatch]) -> Iterator[tuple[int, pa.Table]]:
    """Batches sorted by day cut into ``(day, rows)`` pieces of one day each."""
    for batch in batches:
        if not batch.num_rows:
            continue
        days = np.floor_divide(batch.column(TS_US).to_numpy().astype(np.int64), US_PER_DAY)
        cuts = [0, *(np.flatnonzero(np.diff(days)) + 1).tolist(), len(days)]
        table = pa.Table.from_batches([batch])
        for start, end in zip(cuts[:-1], cuts[1:], strict=True):
            yield int(days[start]), table.slice(start, end - start)


def _write_task(batches: Iterator[pa.RecordBatch], staging: dict[int, str]) -> Iterator[pa.RecordBatch]:
    """mapInArrow over feature rows sorted by (day, time, ``_seq``): each stale day's rows written to
    its staging directory (an attempt's own file, renamed into place: a retried or speculative
    attempt never leaves half a file); rows of other days are dropped, as the local engine drops them."""
    attempt = TaskContext.get().taskAttemptId()
    for day, pieces in groupby(_day_runs(batches), key=lambda piece: piece[0]):
        if day not in staging:
            continue
        final = Path(staging[day]) / PARTITION_FILE
        attempt_file = final.with_name(f".{PARTITION_FILE}.{attempt}")
        rows = write_partition_file(attempt_file, (_row_table(table) for _, table in pieces), ROW_SCHEMA)
        os.replace(attempt_file, final)
        yield pa.RecordBatch.from_pydict({"day": [day], "rows": [rows]},
                                         schema=pa.schema([("day", pa.int32()), ("rows", pa.int64())]))


def night_partitions(rows: int, floor: int, rows_per_task: int | None) -> int:
    """Shuffle partitions of a job over ``rows`` payments: at least ``floor``
    (``spark.sql.shuffle.partitions``), and enough that none averages more than ``rows_per_task``
    (None: ``floor``). A task sorts and holds its partition's keys, so a fixed count would let a
    bigger portfolio grow every executor; this keeps a task's share, and its memory, flat."""
    if rows_per_task is None:
        return floor
    return max(floor, -(-rows // rows_per_task))


def write_stale_dates(spark: SparkSession, table: FeatureTable, files: dict[date, list[Path]], stale: list[date],
                      reports: FraudReports, params: FeatureParams, hot_key_rows: int | None,
                      rows_per_task: int | None = None) -> SparkFeatureRun:
    """Compute the ``stale`` dates (sorted) on executors into staging directories of ``table``;
    publishes nothing (the caller does, :meth:`FeatureTable.publish_staged`). A date without
    payments gets the empty file the local engine writes, from the driver. ``rows_per_task``: see
    :func:`night_partitions`."""
    read = sum(pq.ParquetFile(path).metadata.num_rows for day in _lookback_span(stale) & files.keys()
               for path in files[day])  # the footers: the driver reads no payments
    partitions = night_partitions(read, int(spark.conf.get("spark.sql.shuffle.partitions")), rows_per_task)
    staging = {d: table.staging_dir(d) for d in stale}
    try:
        rows, calls = _run_job(spark, files, stale, reports, params, hot_key_rows, partitions,
                               {(d - EPOCH).days: str(p) for d, p in staging.items()})
        for day in stale:
            if day not in rows:
                rows[day] = write_partition_file(staging[day] / PARTITION_FILE, [], ROW_SCHEMA)
    except BaseException:
        for path in staging.values():
            shutil.rmtree(path, ignore_errors=True)
        raise
    return SparkFeatureRun({d: (staging[d], rows[d]) for d in stale}, calls, partitions)


def _lookback_span(stale: list[date]) -> set[date]:
    """The dates whose payments the ``stale`` dates' features count: each and its lookback."""
    return {d for day in stale for d in (day - timedelta(days=i) for i in range(fd.LOOKBACK_DAYS + 1))}


def _run_job(spark: SparkSession, files: dict[date, list[Path]], stale: list[date], reports: FraudReports,
             params: FeatureParams, hot_key_rows: int | None, partitions: int,
             staging: dict[int, str]) -> tuple[dict[date, int], dict[str, list[int]]]:
    wanted = set(stale)
    span = _lookback_span(stale)
    queries = read_payments(spark, {d: files[d] for d in sorted(wanted & files.keys())}, (*PASSTHROUGH, SEQ))
    history = read_payments(spark, {d: files[d] for d in sorted((span - wanted) & files.keys())}, CARD_HISTORY)
    start_us = (stale[0] - EPOCH - LOOKBACK).days * US_PER_DAY
    picked = reports.between(start_us, ((stale[-1] - EPOCH).days + 1) * US_PER_DAY)
    known = fraud_known_instants(spark, files, reports, picked, params)
    stats = spark.sparkContext.accumulator({}, KernelCallStats())
    rows = apply_feature_kernel(queries, known, partitions, history=history, carry=(SEQ,),
                                hot_key_rows=hot_key_rows, stats=stats)
    written = (rows.repartition(len(stale), F.floor(F.col(TS_US) / US_PER_DAY))
               .sortWithinPartitions(F.floor(F.col(TS_US) / US_PER_DAY), TS_US, SEQ)
               .mapInArrow(partial(_write_task, staging=staging), _WRITTEN_DDL)
               .collect())
    by_day = {EPOCH + timedelta(days=r["day"]): r["rows"] for r in written}
    return by_day, dict(stats.value)
