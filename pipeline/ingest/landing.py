"""Land classified records in the raw store from inside the Kafka read tasks.

Each read task (one offset range of one partition) validates and screens its Arrow batches
(:func:`pipeline.ingest.classify.classify_batch`) and writes them with pyarrow straight into this
run's directories: accepted records to ``<table>/<date column>=D/run_id=R/``, refused ones to
``quarantine/run_id=R/``, and the hashes of the rows it left valid or late to the run's row hashes
(``_state/run_hashes/run_id=R/``), with their identities sorted into a probe
(:func:`pipeline.ingest.store_copies.write_probe`). From these, after the read, the copies of stored
events are found shard by shard of the identity index (:mod:`pipeline.ingest.store_copies`) and the
copies within the run on the driver (:mod:`pipeline.ingest.run_copies`): a read task maps no index.
It hands the JVM one summary row (counts per outcome, the partition's watermark, files written), not
the records: Spark schedules and retries the tasks, while the bytes go Kafka -> Arrow -> Parquet
without row conversions.

Safe to retry: file names derive from (topic, partition, first offset, date), and every file is
written under a dot-name and renamed when complete (:func:`pipeline.atomic.atomic_path`), so a
retried task replaces its own files.
Nothing written here is visible before the run commits (see :mod:`pipeline.ingest.raw_layout`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.atomic import atomic_path
from pipeline.contract import TIME_FIELD_BY_KIND, Kind, RejectReason
from pipeline.ingest.classify import classify_batch
from pipeline.ingest.duplicates import COPY_REASONS, LATE
from pipeline.ingest.identity import RowHashes, as_int64
from pipeline.ingest.kafka_source import BatchTransform
from pipeline.ingest.raw_layout import (
    DATE_COLUMN_BY_KIND,
    PAYLOAD,
    QUARANTINE,
    RUN_HASHES,
    RUN_ID,
    TABLE_BY_KIND,
    quarantine_arrow_schema,
    raw_arrow_schema,
    run_hashes_arrow_schema,
)
from pipeline.ingest.store_copies import probe_path, write_probe
from pipeline.ingest.timing import ReadState, TimingRules
from pipeline.ingest.validate import REASON

# Records refused for their timing, or as copies, are events: the quarantine keeps their hashes.
EVENT_REASONS = [RejectReason.LATE_EVENT.value, RejectReason.FUTURE_EVENT_TIME.value, *COPY_REASONS]

SUMMARY_DDL = "topic string, partition int, first_offset long, last_offset long, read long, outcomes string, " \
              "watermark long, files string"
ROW_GROUP_ROWS = 65_536  # buffer this many rows per file before writing a row group


@dataclass(frozen=True)
class ChunkSummary:
    """What one read task landed (one row of the landing DataFrame)."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    read: int
    outcomes: dict[str, int]  # reject_reason or "valid" -> rows
    watermark: int | None  # latest accepted event time, epoch us
    files: dict[str, int]  # path relative to the store root -> rows


class _Files:
    """Lazily opened Parquet writers, each buffering rows into large row groups; each file is
    published (:func:`pipeline.atomic.atomic_path`: flushed, renamed) when the task closes them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.publish = ExitStack()  # one atomic_path per file, left in order on close
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.buffers: dict[str, list[pa.Table]] = {}
        self.rows: dict[str, int] = {}

    def add(self, relpath: str, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        self.buffers.setdefault(relpath, []).append(table)
        self.rows[relpath] = self.rows.get(relpath, 0) + table.num_rows
        if sum(t.num_rows for t in self.buffers[relpath]) >= ROW_GROUP_ROWS:
            self._flush(relpath)

    def _flush(self, relpath: str) -> None:
        tables = self.buffers.pop(relpath, [])
        if not tables:
            return
        if relpath not in self.writers:
            tmp = self.publish.enter_context(atomic_path(self.root / relpath))
            self.writers[relpath] = pq.ParquetWriter(tmp, tables[0].schema, compression="zstd")
        self.writers[relpath].write_table(pa.concat_tables(tables))

    def close(self) -> dict[str, int]:
        for relpath in list(self.buffers):
            self._flush(relpath)
        for writer in self.writers.values():
            writer.close()
        self.publish.close()
        return dict(self.rows)


def _raw_rows(table: pa.Table, kind: Kind) -> pa.Table:
    accepted = table.filter(pc.is_null(table[REASON]))
    columns = {"kafka_timestamp": accepted["timestamp"], PAYLOAD: accepted["value"].cast(pa.string())}
    schema = raw_arrow_schema(kind)
    return pa.table([columns[f.name] if f.name in columns else accepted[f.name] for f in schema], schema=schema)


def _quarantine_rows(table: pa.Table, kind: Kind, hashes: RowHashes, quarantine_identical: bool) -> pa.Table:
    """The refused rows (identical copies only when ``quarantine_identical``: otherwise they are
    only counted) in the quarantine's schema."""
    reasons = table[REASON]
    refused = pc.is_valid(reasons)
    if not quarantine_identical:
        refused = pc.and_(refused, pc.fill_null(pc.not_equal(reasons, RejectReason.DUPLICATE.value), True))
    rows = np.flatnonzero(refused.to_numpy(zero_copy_only=False))
    refused_rows = table.take(pa.array(rows, pa.int64()))
    schema = quarantine_arrow_schema()
    # Records refused only for their timing, or as copies, are events: their identity is kept, so
    # that a later copy (or this one, when an earlier copy exists) is found as a duplicate
    # (pipeline.ingest.duplicates).
    typed = pc.is_in(refused_rows[REASON], pa.array(EVENT_REASONS)).to_numpy(zero_copy_only=False)
    events = rows[typed]
    # id_hash: the identity's first 64 bits (enough to find the row; the index holds all 128).
    kept = {"id_hash": hashes.identities(events)["h1"], "content_hash": hashes.contents(events)}
    columns = {"kind": pa.repeat(kind.value, len(rows)), "kafka_timestamp": refused_rows["timestamp"]}
    for name, values in kept.items():
        full = np.zeros(len(rows), np.uint64)
        full[typed] = values
        columns[name] = pa.array(full.view(np.int64), pa.int64(), mask=~typed)
    return pa.table([columns[f.name] if f.name in columns else refused_rows[f.name] for f in schema], schema=schema)


def _run_hash_rows(table: pa.Table, kind: Kind, hashes: RowHashes) -> tuple[pa.Table, np.ndarray]:
    """The hashes of the rows left valid or late, in the task's order (the run's copies are found
    from these: :func:`pipeline.ingest.run_copies.settle_copies`), and their identities (the probe's)."""
    reasons = table[REASON]
    late = pc.fill_null(pc.equal(reasons, LATE), False)
    open_rows = pa.array(np.flatnonzero(pc.or_(pc.is_null(reasons), late).to_numpy(zero_copy_only=False)), pa.int64())
    rows = open_rows.to_numpy()
    ids = hashes.identities(rows)
    chosen = table.take(open_rows)
    columns = {"id_h1": as_int64(ids["h1"]), "id_h2": as_int64(ids["h2"]),
               "content_hash": as_int64(hashes.contents(rows)), "kafka_timestamp": chosen["timestamp"],
               "partition": chosen["partition"], "offset": chosen["offset"],
               "day": pc.cast(chosen[TIME_FIELD_BY_KIND[kind]], pa.date32()), "late": late.take(open_rows)}
    return pa.table(list(columns.values()), schema=run_hashes_arrow_schema()), ids


@dataclass
class _Tally:
    """What one read task has seen so far."""

    topic: str | None = None
    partition: int | None = None
    first: int | None = None
    last: int | None = None
    read: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, table: pa.Table) -> None:
        self.topic, self.partition = table["topic"][0].as_py(), table["partition"][0].as_py()
        self.first = self.first if self.first is not None else table["offset"][0].as_py()
        self.last, self.read = table["offset"][-1].as_py(), self.read + table.num_rows
        for item in pc.value_counts(pc.fill_null(table[REASON], "valid")).to_pylist():
            self.outcomes[item["values"]] = self.outcomes.get(item["values"], 0) + item["counts"]

    @property
    def stem(self) -> str:
        """File name stem: the same on a retry of the same task (same first record)."""
        return f"part-{self.topic}-{self.partition:05d}-{self.first:012d}"


def _write(table: pa.Table, kind: Kind, run_id: str, stem: str, files: _Files, hashes: RowHashes,
           quarantine_identical: bool) -> np.ndarray:
    """Accepted rows to their date partitions, refused rows to the quarantine (identical copies
    only when ``quarantine_identical``: otherwise they are only counted); returns the identities
    of the rows left valid or late (what the row hashes got)."""
    raw = _raw_rows(table, kind)
    days = pc.cast(raw[TIME_FIELD_BY_KIND[kind]], pa.date32())
    for day in pc.unique(days).to_pylist():
        rows = raw.filter(pc.equal(days, pa.scalar(day, pa.date32())))
        files.add(f"{TABLE_BY_KIND[kind]}/{DATE_COLUMN_BY_KIND[kind]}={day.isoformat()}/{RUN_ID}={run_id}/{stem}.parquet",
                  rows)
    files.add(f"{QUARANTINE}/{RUN_ID}={run_id}/{kind.value}-{stem}.parquet",
              _quarantine_rows(table, kind, hashes, quarantine_identical))
    open_rows, ids = _run_hash_rows(table, kind, hashes)
    files.add(_hashes_relpath(kind, run_id, stem), open_rows)
    return ids


def _hashes_relpath(kind: Kind, run_id: str, stem: str) -> str:
    return f"{RUN_HASHES}/{RUN_ID}={run_id}/{kind.value}-{stem}.parquet"


def land_stream(batches: Iterator[pa.RecordBatch], args: dict) -> Iterator[pa.RecordBatch]:
    """The :class:`BatchTransform` entry point (``args`` from :func:`landing_transform`): classify
    and write every batch, then yield one summary row (nothing for an empty range)."""
    kind, rules = Kind(args["kind"]), TimingRules.from_dict(args["rules"])
    state = ReadState(dict(rules.committed_watermarks))
    files, tally, identities = _Files(Path(args["root"])), _Tally(), []
    for batch in batches:
        if batch.num_rows:
            table = classify_batch(batch, kind, rules, state)
            tally.add(table)
            identities.append(_write(table, kind, args["run_id"], tally.stem, files, RowHashes(table, kind),
                                     args["quarantine_duplicates"]))
    if tally.read:
        ids = np.concatenate(identities)
        if len(ids):  # written before the summary: the driver reads probes of the files it lists
            write_probe(probe_path(files.root / _hashes_relpath(kind, args["run_id"], tally.stem)), ids)
        written = {path: rows for path, rows in files.close().items() if not path.startswith(RUN_HASHES)}
        yield _summary_batch(ChunkSummary(tally.topic, tally.partition, tally.first, tally.last, tally.read,
                                          tally.outcomes, state.watermark(tally.partition), written))


def _summary_batch(s: ChunkSummary) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({
        "topic": [s.topic], "partition": pa.array([s.partition], pa.int32()), "first_offset": [s.first_offset],
        "last_offset": [s.last_offset], "read": [s.read], "outcomes": [json.dumps(s.outcomes)],
        "watermark": pa.array([s.watermark], pa.int64()), "files": [json.dumps(s.files)]})


def landing_transform(kind: Kind, rules: TimingRules, run_id: str, root: Path,
                      quarantine_duplicates: bool = True) -> BatchTransform:
    """The read tasks' work for one topic (they write only under ``run_id``: nothing changes before the commit)."""
    return BatchTransform("pipeline.ingest.landing:land_stream",
                          {"kind": kind.value, "rules": asdict(rules), "run_id": run_id, "root": str(root),
                           "quarantine_duplicates": quarantine_duplicates},
                          SUMMARY_DDL)


def parse_summaries(rows: list) -> list[ChunkSummary]:
    """Spark rows of the landing DataFrame -> summaries."""
    return [ChunkSummary(r["topic"], r["partition"], r["first_offset"], r["last_offset"], r["read"],
                         json.loads(r["outcomes"]), r["watermark"], json.loads(r["files"])) for r in rows]

