"""Which of a run's records the raw store already holds: the identity index looked up shard by shard.

The read tasks do not touch the index. Each writes, beside its row hashes, a probe: its rows'
identities sorted on ``h1`` with each row's position in its hashes (``<kind>-<stem>.probe.npy``, a
``(3, n)`` uint64 array). The index is sharded the same way, by the top :data:`~pipeline.ingest.id_index.BUCKET_BITS`
bits of ``h1`` (:mod:`pipeline.ingest.id_index`), so one bucket's records are one slice of every probe.

A lookup task takes a contiguous range of buckets: it maps, of every probe, only the pages of its
slice, and of the index only its buckets' files (of every live segment), one bucket at a time.
So no process maps the whole index, and a night's check costs O(its records x log history) in all,
shared among the tasks. The found rows are all that comes back: ``(probe, row, stored content,
date, run)``, few on a night without resends.

Where the tasks run (``[raw] index_lookup``): ``"spark"``, on the executors, ``[raw] index_lookup_tasks``
tasks (the raw store's filesystem is shared, as for every read task); ``"driver"``, the same tasks one
after another in this process: no Spark job to schedule, the faster way while a night is small, and
the driver holds the pages of one bucket at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from pipeline.atomic import atomic_path
from pipeline.ingest.id_index import BUCKET_BITS, BUCKETS, IdIndex, Matches
from pipeline.ingest.identity import IDENTITY

PROBE_SUFFIX = ".probe.npy"
FOUND_DDL = "probe int, row long, content long, day int, run int"
_FOUND_SCHEMA = pa.schema([("probe", pa.int32()), ("row", pa.int64()), ("content", pa.int64()),
                           ("day", pa.int32()), ("run", pa.int32())])


def probe_path(hash_file: Path) -> Path:
    """The probe beside a read task's row hashes (``<kind>-<stem>.parquet``)."""
    return hash_file.with_name(hash_file.name.removesuffix(".parquet") + PROBE_SUFFIX)


def write_probe(path: Path, ids: np.ndarray) -> None:
    """A read task's probe: ``ids`` (:data:`IDENTITY`, in its row hashes' order) sorted on ``h1``, with
    each one's position; written whole under a temporary name, then renamed (a retry replaces it)."""
    order = np.argsort(ids["h1"], kind="stable")
    probe = np.stack([ids["h1"][order], ids["h2"][order], order.astype(np.uint64)])
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        np.save(out, probe)


def bucket_ranges(tasks: int) -> list[tuple[int, int]]:
    """``[first, last)`` bucket ranges for ``tasks`` lookup tasks (at most one task per bucket)."""
    edges = np.linspace(0, BUCKETS, min(max(tasks, 1), BUCKETS) + 1).round().astype(int)
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _slice(probe: np.ndarray, first: int, last: int) -> tuple[int, int]:
    """Columns of ``probe`` whose ``h1`` falls in buckets ``[first, last)`` (a binary search: the
    pages of the slice and O(log n) others are all a mapped probe reads)."""
    shift = np.uint64(64 - BUCKET_BITS)
    lo = np.searchsorted(probe[0], np.uint64(first) << shift) if first else 0
    hi = np.searchsorted(probe[0], np.uint64(last) << shift) if last < BUCKETS else probe.shape[1]
    return int(lo), int(hi)


def lookup_buckets(index_root: str, segments: list[str], probes: list[str], first: int, last: int) -> pa.Table:
    """One lookup task: the rows of every probe in buckets ``[first, last)`` that the index holds,
    one bucket at a time (its slices of all the probes searched together)."""
    index = IdIndex(Path(index_root), segments)
    mapped = [np.load(path, mmap_mode="r") for path in probes]
    found = []
    for bucket in range(first, last):
        slices = [(number, *_slice(probe, bucket, bucket + 1)) for number, probe in enumerate(mapped)]
        slices = [(number, lo, hi) for number, lo, hi in slices if hi > lo]
        if not slices:
            continue
        ids = np.empty(sum(hi - lo for _, lo, hi in slices), IDENTITY)
        ids["h1"] = np.concatenate([mapped[number][0, lo:hi] for number, lo, hi in slices])
        ids["h2"] = np.concatenate([mapped[number][1, lo:hi] for number, lo, hi in slices])
        # keep_mapped=False: the bucket's pages are let go once searched (this bucket only, as ``ids`` are).
        matches = index.lookup(ids, keep_mapped=False)
        hit = np.flatnonzero(matches.found)
        probe_of = np.concatenate([np.full(hi - lo, number, np.int32) for number, lo, hi in slices])
        row_of = np.concatenate([mapped[number][2, lo:hi].astype(np.int64) for number, lo, hi in slices])
        found.append(pa.table([pa.array(probe_of[hit]), pa.array(row_of[hit]),
                               pa.array(matches.contents[hit].view(np.int64)),
                               pa.array(matches.days[hit]), pa.array(matches.runs[hit])], schema=_FOUND_SCHEMA))
    return pa.concat_tables(found) if found else _FOUND_SCHEMA.empty_table()


def _lookup_task(batches: Iterator[pa.RecordBatch], index_root: str, segments: list[str], probes: list[str],
                 ranges: list[tuple[int, int]]) -> Iterator[pa.RecordBatch]:
    """mapInArrow over task numbers: each number's bucket range looked up."""
    for batch in batches:
        for task in batch.column(0).to_pylist():
            yield from lookup_buckets(index_root, segments, probes, *ranges[task]).to_batches()


@dataclass(frozen=True)
class StoreLookup:
    """Where the lookup tasks run: on Spark's executors (``spark``), or one after another on the
    driver (``spark`` None)."""

    spark: SparkSession | None = None
    tasks: int = BUCKETS

    def matches(self, index: IdIndex, hash_files: list[Path]) -> Matches:
        """The index's entries for the rows of ``hash_files`` (read tasks' row hashes with their
        probes), in their concatenated order, as :func:`pipeline.ingest.run_copies.settle_copies` reads them."""
        probes = [probe_path(f) for f in hash_files]
        sizes = [np.load(p, mmap_mode="r").shape[1] for p in probes]
        matches = Matches.none(sum(sizes))
        if not index.segments or not len(matches.found):
            return matches
        found = self._found(index, [str(p) for p in probes])
        rows = np.concatenate([[0], np.cumsum(sizes)])[:-1][found["probe"].to_numpy()] + found["row"].to_numpy()
        matches.found[rows] = True
        matches.contents[rows] = found["content"].to_numpy().view(np.uint64)
        matches.days[rows], matches.runs[rows] = found["day"].to_numpy(), found["run"].to_numpy()
        return matches

    def _found(self, index: IdIndex, probes: list[str]) -> pa.Table:
        ranges = bucket_ranges(self.tasks)
        if self.spark is None:
            return pa.concat_tables([lookup_buckets(str(index.root), index.segments, probes, *r) for r in ranges])
        task = partial(_lookup_task, index_root=str(index.root), segments=list(index.segments), probes=probes,
                       ranges=ranges)
        found = self.spark.range(0, len(ranges), 1, len(ranges)).mapInArrow(task, FOUND_DDL).toArrow()
        return found.cast(_FOUND_SCHEMA)
