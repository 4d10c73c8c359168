"""The identity index: every committed event's identity hash, so a run checks its records
against the whole history at a cost that grows with the run, not with the history.

Layout under ``<raw>/_index/<table>/``::

    <first>-<last>/bucket-XX.npy   # one segment: the runs with ordinals first..last, 16 buckets

A bucket holds the entries whose identity hash (:data:`pipeline.ingest.identity.IDENTITY`, 128
bits) has those top 4 bits in ``h1``, as one ``(4, n)`` uint64 array sorted on rows 0 and 1: the
identity's ``h1`` and ``h2``, content hash, ``partition date (days) << 32 | run ordinal`` (the
ordinal is the run's position in the commit log's run list, which only appends). A lookup
memory-maps each bucket and binary-searches the run's sorted ``h1``, then compares ``h2``: it
touches O(new ids x log history) pages, never reads a segment whole.

Format: :data:`INDEX_FORMAT`, recorded beside the live segments in the commit log. Version 1 kept
64-bit identities in ``(3, n)`` buckets (and other hash functions); the commit log drops an index of
another format when it is loaded (:class:`pipeline.ingest.offsets.OffsetStore`), so the store gets
a new one built from its committed files like a store that predates the index, and a bucket of
another shape raises :class:`IndexFormatError` rather than being misread.

Segments merge like a binary counter: each commit adds one segment for its run, then the two
newest merge while they cover the same number of runs and the merge stays under
:data:`MAX_SEGMENT_ENTRIES`. So a store of n runs has about log2(n) segments, and each entry is
rewritten about log2(n) times over its life (segments at the cap stop merging).

Consistency with the commit: segments are written (each directory complete before it is renamed
into place) before the commit, and the commit log lists the live segments
(:class:`pipeline.ingest.offsets.StoreCommit`). Readers use only listed segments; a killed run's
segments are unlisted and the next run deletes them (``RawStore.discard_uncommitted``). A store
committed before the index existed gets it built from its committed files on first use.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np

from pipeline.atomic import fsync_path, publish_dir
from pipeline.ingest.identity import IDENTITY

BUCKET_BITS = 4
BUCKETS = 1 << BUCKET_BITS
MAX_SEGMENT_ENTRIES = 64_000_000  # ~1.5 GB a segment: beyond that, merging costs more than it saves
INDEX_DIR = "_index"
EPOCH = date(1970, 1, 1)  # day 0 of Entries.days
INDEX_FORMAT = 2  # 128-bit identities (4 rows a bucket); 1 (unmarked in the commit log): 64-bit, 3 rows
_ROWS = 4  # h1, h2, content, locator


class IndexFormatError(RuntimeError):
    """A bucket on disk is not of :data:`INDEX_FORMAT` (a store written by another version)."""


@dataclass(frozen=True)
class Entries:
    """Index entries (parallel arrays): identity hash, content hash, partition date, run ordinal."""

    ids: np.ndarray  # IDENTITY (128 bits)
    contents: np.ndarray  # uint64
    days: np.ndarray  # int32, days since 1970-01-01
    runs: np.ndarray  # int32, position in the commit log's runs

    @staticmethod
    def empty() -> Entries:
        return Entries(np.zeros(0, IDENTITY), np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32))

    @staticmethod
    def concat(parts: list[Entries]) -> Entries:
        if not parts:
            return Entries.empty()
        return Entries(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("ids", "contents", "days", "runs")))

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True)
class Matches:
    """For each looked-up hash: found, and the stored entry's content hash, date and run."""

    found: np.ndarray  # bool
    contents: np.ndarray
    days: np.ndarray
    runs: np.ndarray

    @staticmethod
    def none(n: int) -> Matches:
        """``n`` hashes, none of them stored."""
        return Matches(np.zeros(n, bool), np.zeros(n, np.uint64), np.zeros(n, np.int32), np.zeros(n, np.int32))


def segment_name(first_run: int, last_run: int) -> str:
    return f"{first_run:06d}-{last_run:06d}"


def segment_span(name: str) -> tuple[int, int]:
    first, last = name.split("-")
    return int(first), int(last)


def _merges(older: str, newer: str, entries: int) -> bool:
    """The merge rule: two neighbouring segments covering as many runs, and not too big together."""
    (a0, a1), (b0, b1) = segment_span(older), segment_span(newer)
    return a1 - a0 == b1 - b0 and entries <= MAX_SEGMENT_ENTRIES


def counter_layout(runs: int) -> list[str]:
    """The segments that ``runs`` commits of small runs leave (what :meth:`IdIndex.with_run`
    produces; a benchmark builds a long history in this layout directly)."""
    segments: list[str] = []
    for run in range(runs):
        segments.append(segment_name(run, run))
        while len(segments) >= 2 and _merges(segments[-2], segments[-1], 0):
            segments[-2:] = [segment_name(segment_span(segments[-2])[0], run)]
    return segments


def _pack(e: Entries) -> np.ndarray:
    """The entries as bucket rows, sorted on ``h1`` then ``h2``."""
    locator = (e.days.astype(np.int64).astype(np.uint64) << np.uint64(32)) | e.runs.astype(np.uint64)
    packed = np.stack([e.ids["h1"], e.ids["h2"], e.contents, locator])
    return packed[:, np.lexsort((packed[1], packed[0]))]


def _unpack(packed: np.ndarray) -> Entries:
    ids = np.empty(packed.shape[1], IDENTITY)
    ids["h1"], ids["h2"] = packed[0], packed[1]
    locator = packed[3]
    return Entries(ids, packed[2], (locator >> np.uint64(32)).astype(np.int64).astype(np.int32),
                   (locator & np.uint64(0xFFFFFFFF)).astype(np.int32))


def _find(stored: np.ndarray, h1: np.ndarray, h2: np.ndarray) -> np.ndarray:
    """Column of each ``(h1, h2)`` (``h1`` sorted) in one bucket's sorted rows, or -1. Entries
    sharing an ``h1`` (a 64-bit collision: about one in a store's lifetime) sit side by side; the
    loop steps through them and runs once more only while such a run is still open."""
    m = stored.shape[1]
    where = np.full(len(h1), -1, np.int64)
    if m == 0:
        return where
    at = np.searchsorted(stored[0], h1)
    open_rows = np.flatnonzero(at < m)
    while len(open_rows):
        col = at[open_rows]
        same_h1 = stored[0][col] == h1[open_rows]
        same = same_h1 & (stored[1][col] == h2[open_rows])
        where[open_rows[same]] = col[same]
        open_rows = open_rows[same_h1 & ~same]
        at[open_rows] += 1
        open_rows = open_rows[at[open_rows] < m]
    return where


def bucket_of(h1: np.ndarray) -> np.ndarray:
    """The index bucket of each identity, from its ``h1`` (its top :data:`BUCKET_BITS` bits)."""
    return (h1 >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)


class IdIndex:
    """The identity index of one raw table (see module doc). ``segments`` are the live ones."""

    def __init__(self, root: Path, segments: list[str]) -> None:
        self.root = Path(root)
        self.segments = sorted(segments, key=segment_span)
        self._mapped: dict[tuple[str, int], np.ndarray] = {}  # for callers that look up call after call

    def _bucket_path(self, segment: str, bucket: int) -> Path:
        return self.root / segment / f"bucket-{bucket:02d}.npy"

    def _load(self, segment: str, bucket: int, keep_mapped: bool = True) -> np.ndarray:
        key = (segment, bucket)
        if key not in self._mapped:
            path = self._bucket_path(segment, bucket)
            bucket_rows = np.load(path, mmap_mode="r")
            if bucket_rows.ndim != 2 or bucket_rows.shape[0] != _ROWS or bucket_rows.dtype != np.uint64:
                raise IndexFormatError(
                    f"{path} has shape {bucket_rows.shape}, not an identity-index bucket of format {INDEX_FORMAT} "
                    f"({_ROWS} uint64 rows): the index was written by another version. Delete the raw store's "
                    f"{INDEX_DIR}/ directory and the 'index' entry of its _state/offsets.json; the next ingest "
                    f"rebuilds the index from the committed files")
            if not keep_mapped:
                return bucket_rows
            self._mapped[key] = bucket_rows
        return self._mapped[key]

    def lookup(self, ids: np.ndarray, keep_mapped: bool = True) -> Matches:
        """Which of ``ids`` (:data:`IDENTITY` hashes) the live segments hold, and their entries.

        ``keep_mapped``: keep every bucket mapped for the next call. A one-shot lookup in a long-lived
        process (the night's fraud reports, on the driver; a run's records, bucket by bucket) passes False: each bucket is unmapped once searched, so the process holds the pages of at most
        one bucket (a sixteenth of the touched index) instead of every page it touched."""
        n = len(ids)
        found = np.zeros(n, bool)
        contents, days, runs = np.zeros(n, np.uint64), np.zeros(n, np.int32), np.zeros(n, np.int32)
        if n == 0 or not self.segments:
            return Matches(found, contents, days, runs)
        order = np.argsort(ids["h1"], kind="stable")
        sorted_h1, sorted_h2 = ids["h1"][order], ids["h2"][order]
        bounds = np.searchsorted(bucket_of(sorted_h1), np.arange(BUCKETS + 1))
        for bucket in range(BUCKETS):
            lo, hi = bounds[bucket], bounds[bucket + 1]
            if lo == hi:
                continue
            for segment in self.segments:
                stored = self._load(segment, bucket, keep_mapped)
                at = _find(stored, sorted_h1[lo:hi], sorted_h2[lo:hi])
                hit = (at >= 0) & ~found[order[lo:hi]]
                rows = order[lo:hi][hit]
                entry = _unpack(np.asarray(stored[:, at[hit]]))
                found[rows], contents[rows], days[rows], runs[rows] = True, entry.contents, entry.days, entry.runs
        return Matches(found, contents, days, runs)

    def _write_segment(self, name: str, entries: Entries) -> None:
        """One segment directory, complete before it appears under its name."""
        final = self.root / name
        tmp = self.root / f".{name}.tmp"
        self._mapped = {k: v for k, v in self._mapped.items() if k[0] != name}  # replaced below
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        packed = _pack(entries)
        bounds = np.searchsorted(bucket_of(packed[0]), np.arange(BUCKETS + 1))
        for bucket in range(BUCKETS):
            path = tmp / f"bucket-{bucket:02d}.npy"
            np.save(path, np.ascontiguousarray(packed[:, bounds[bucket]:bounds[bucket + 1]]))
            fsync_path(path)
        publish_dir(tmp, final)  # an existing ``final`` is an unlisted leftover of a killed run

    def _read_segment(self, name: str) -> Entries:
        packed = np.concatenate([np.asarray(self._load(name, b)) for b in range(BUCKETS)], axis=1)
        return _unpack(packed)

    def _entries(self, name: str) -> int:
        return sum(self._load(name, b).shape[1] for b in range(BUCKETS))

    def with_segment(self, name: str, entries: Entries) -> list[str]:
        """Write one segment named ``name``; returns the live list with it added (to commit)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_segment(name, entries)
        return [*self.segments, name]

    def with_run(self, run_ordinal: int, entries: Entries) -> list[str]:
        """Write the segment of run ``run_ordinal`` and merge as the module doc says; returns the
        segment list to commit (nothing listed changes until the commit). A run that kept nothing
        adds no segment."""
        if not len(entries):
            return list(self.segments)
        segments = self.with_segment(segment_name(run_ordinal, run_ordinal), entries)
        while len(segments) >= 2 and _merges(segments[-2], segments[-1],
                                             self._entries(segments[-2]) + self._entries(segments[-1])):
            merged = segment_name(segment_span(segments[-2])[0], segment_span(segments[-1])[1])
            self._write_segment(merged, Entries.concat([self._read_segment(s) for s in segments[-2:]]))
            segments[-2:] = [merged]
        return segments

    def discard_unlisted(self) -> list[Path]:
        """Delete segment directories (and temporaries) that the live list does not name."""
        if not self.root.is_dir():
            return []
        live = set(self.segments)
        stale = [p for p in self.root.iterdir() if p.is_dir() and p.name not in live]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return stale
