"""Find and move the copies among one run's landed records (:mod:`pipeline.ingest.duplicates`).

The read tasks landed the run's records as valid (raw files) or refused (quarantine files). Beside its
files, each task wrote the hashes of the rows it left valid or late (``LATE_EVENT``), in its files' row
order (the raw store's run hashes, :func:`pipeline.ingest.raw_layout.run_hashes_arrow_schema`), and
their identities sorted into a probe. On the driver, before the commit, this module asks the identity
index which of those rows the store already holds (:class:`pipeline.ingest.store_copies.StoreLookup`,
shard by shard), classifies the rows in one frame (a copy of another read task's record is only
visible here) from the hashes alone, and reads and rewrites a landed file only where a copy was found:

* a valid row that is a copy leaves its raw file for ``quarantine/run_id=R/<kind>-copies.parquet``;
* a late row that is a copy is re-marked in its quarantine file (``DUPLICATE`` or
  ``CONFLICTING_DUPLICATE`` instead of ``LATE_EVENT``);
* identical copies are dropped instead of quarantined when ``[raw] quarantine_duplicates = false``
  (they are still counted).

A copy's detail names its first copy: the raw store's partition and run that hold it, or its Kafka
position in this run. So a night without copies costs O(its rows) of small hash columns, not a
read-back of every landed payload (measured by ``fraudctl bench ingest``); a night of resends rewrites
the files that hold them. :class:`RunCopies` returns the moves that the accounting applies to the read
tasks' counts, and the index entries of the rows that stay valid (a transaction's entry id is what a
label's ``transaction_id`` hashes to: orphan labels are checked against them). Nothing here is visible
before the commit: a killed run leaves uncommitted files, which the next run deletes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract import Kind, RejectReason
from pipeline.ingest.accounting import CopyMoves
from pipeline.ingest.duplicates import (
    CONFLICTING,
    DUPLICATE,
    KEEP,
    LATE,
    Copies,
    arrival_order,
    classify_copies,
    run_copy_details,
    stored_copy_details,
)
from pipeline.ingest.id_index import Entries, Matches
from pipeline.ingest.identity import IDENTITY, IDENTITY_BY_KIND, from_int64
from pipeline.ingest.raw_layout import (
    DATE_COLUMN_BY_KIND,
    PAYLOAD,
    QUARANTINE,
    RUN_ID,
    TABLE_BY_KIND,
    RawStore,
    quarantine_arrow_schema,
    write_table_atomic,
)
from pipeline.ingest.store_copies import StoreLookup
from pipeline.ingest.validate import DETAIL, FIELD, REASON


class RunHashesMismatch(RuntimeError):
    """A run's row hashes do not describe its landed files (never expected: the tasks write both)."""


@dataclass(frozen=True)
class RunCopies:
    moves: CopyMoves
    kept: Entries  # index entries of the rows that stay valid

    @staticmethod
    def none() -> RunCopies:
        return RunCopies(CopyMoves(), Entries.empty())


@dataclass(frozen=True)
class _RunRows:
    """The run's valid and late rows from its row hashes, parallel arrays in task-file order."""

    stems: list[str]  # one per read task (its files' name stem)
    task: np.ndarray  # int32: index into ``stems``
    ids: np.ndarray  # IDENTITY
    contents: np.ndarray  # uint64
    arrival: np.ndarray  # int64 (arrival_order)
    partition: np.ndarray
    offset: np.ndarray
    day: np.ndarray  # int32 days since the epoch
    late: np.ndarray  # bool


def _read_run_rows(paths: list[Path], kind: Kind) -> _RunRows:
    stems = [p.stem.removeprefix(f"{kind.value}-") for p in paths]
    tables = [pq.read_table(p) for p in paths]
    table = pa.concat_tables(tables)
    ids = np.empty(table.num_rows, IDENTITY)
    ids["h1"], ids["h2"] = from_int64(table["id_h1"]), from_int64(table["id_h2"])
    task = np.repeat(np.arange(len(paths), dtype=np.int32), [t.num_rows for t in tables])
    as_np = lambda name: table[name].to_numpy()  # noqa: E731
    return _RunRows(stems, task, ids, from_int64(table["content_hash"]), arrival_order(table["kafka_timestamp"]),
                    as_np("partition"), as_np("offset"), table["day"].cast(pa.int32()).to_numpy(), as_np("late"))


def _as_quarantine(rows: pa.Table, kind: Kind, reasons: np.ndarray, details: np.ndarray,
                   ids: np.ndarray, contents: np.ndarray) -> pa.Table:
    n = rows.num_rows
    columns = {"kind": pa.repeat(kind.value, n), "value": rows[PAYLOAD].cast(pa.binary()),
               REASON: pa.array(reasons, pa.string()), FIELD: pa.repeat(IDENTITY_BY_KIND[kind][0], n),
               DETAIL: pa.array(details, pa.string()), "id_hash": pa.array(ids["h1"].view(np.int64)),
               "content_hash": pa.array(contents.view(np.int64))}
    schema = quarantine_arrow_schema()
    return pa.table([columns[f.name] if f.name in columns else rows[f.name] for f in schema], schema=schema)


def _details(kind: Kind, rows: _RunRows, copies: Copies, stored: Matches, runs: tuple[str, ...]) -> np.ndarray:
    """The quarantine detail of each copy (object array parallel to ``rows``; None where no copy):
    where its first copy is, in the store (``stored``: each row's entry, whose run is a position in
    the commit log's ``runs``) or in this run."""
    details = np.full(len(rows.ids), None, object)
    copy = copies.outcome != KEEP
    identical = copies.outcome == DUPLICATE
    in_run = np.flatnonzero(copy & ~copies.first_in_store)
    if len(in_run):
        first = copies.first_row[in_run]
        details[in_run] = run_copy_details(identical[in_run], rows.partition[first], rows.offset[first],
                                           ~rows.late[first]).to_numpy(zero_copy_only=False)
    in_store = np.flatnonzero(copy & copies.first_in_store)
    if len(in_store):
        run_ids = np.asarray(runs, object)[stored.runs[in_store]]
        details[in_store] = stored_copy_details(kind, identical[in_store], stored.days[in_store],
                                                run_ids).to_numpy(zero_copy_only=False)
    return details


def settle_copies(store: RawStore, kind: Kind, run_id: str, run_ordinal: int, quarantine_identical: bool,
                  lookup: StoreLookup | None = None) -> RunCopies:
    """Classify and move the copies among run ``run_id``'s landed rows of ``kind`` (see module doc);
    ``run_ordinal`` is the run's position in the commit log once committed (its index entries').
    The store's committed identity index of ``kind`` is looked up by ``lookup`` (default: on the driver)."""
    paths = store.run_hash_files(run_id, kind)
    if not paths:
        return RunCopies.none()
    rows = _read_run_rows(paths, kind)
    _check_raw_rows(store, kind, run_id, rows)
    stored = (lookup or StoreLookup()).matches(store.id_index(kind), paths)
    if len(stored.found) != len(rows.ids):
        raise RunHashesMismatch(f"run {run_id}'s {TABLE_BY_KIND[kind]} probes hold {len(stored.found)} rows, its "
                                f"row hashes {len(rows.ids)}: the run is not committed; rerun it (its files are "
                                "discarded first)")
    copies = classify_copies(rows.ids, rows.arrival, rows.partition, rows.offset, rows.contents, stored)
    if copies.outcome.any():
        _move_copies(store, kind, run_id, rows, copies, _details(kind, rows, copies, stored, store.committed().runs),
                     quarantine_identical)
    is_raw = ~rows.late
    kept = np.flatnonzero(is_raw & (copies.outcome == KEEP))
    moves = CopyMoves(copies.count(DUPLICATE, is_raw), copies.count(CONFLICTING, is_raw),
                      copies.count(DUPLICATE, ~is_raw), copies.count(CONFLICTING, ~is_raw))
    entries = Entries(rows.ids[kept], rows.contents[kept], rows.day[kept], np.full(len(kept), run_ordinal, np.int32))
    return RunCopies(moves, entries)


def _raw_path(store: RawStore, kind: Kind, run_id: str, day: int, stem: str) -> Path:
    """The raw file a read task wrote for one day (:func:`pipeline.ingest.landing._write`'s name)."""
    iso = np.datetime64(int(day), "D").astype(str)
    return store.table_path(kind) / f"{DATE_COLUMN_BY_KIND[kind]}={iso}" / f"{RUN_ID}={run_id}" / f"{stem}.parquet"


def _check_raw_rows(store: RawStore, kind: Kind, run_id: str, rows: _RunRows) -> None:
    """The hashes' valid rows are the raw files' rows, file by file (Parquet footers only): the copies
    are moved by row position, so a mismatch would move the wrong rows."""
    valid = ~rows.late
    files, counts = np.unique((rows.task[valid].astype(np.int64) << 32) | rows.day[valid].astype(np.int64),
                              return_counts=True)
    expected = {_raw_path(store, kind, run_id, int(f & 0xFFFFFFFF), rows.stems[int(f >> 32)]): int(n)
                for f, n in zip(files, counts, strict=True)}
    landed = {p: pq.ParquetFile(p).metadata.num_rows for p in store.run_files(run_id, kind)[0]}
    if expected != landed:
        differ = sorted(str(p) for p in set(expected) | set(landed) if expected.get(p) != landed.get(p))
        raise RunHashesMismatch(f"run {run_id}'s {TABLE_BY_KIND[kind]} row hashes do not match its landed files "
                                f"({len(differ)} differ, first {differ[0]}): the run is not committed; rerun it "
                                "(its files are discarded first)")


def _move_copies(store: RawStore, kind: Kind, run_id: str, rows: _RunRows, copies: Copies, details: np.ndarray,
                 quarantine_identical: bool) -> None:
    """Rewrite the landed files that hold copies (see module doc), each copy with its ``details``."""
    reasons = np.where(copies.outcome == DUPLICATE, RejectReason.DUPLICATE.value,
                       RejectReason.CONFLICTING_DUPLICATE.value).astype(object)
    # Which copies become quarantine rows: all of them, or only the conflicting ones.
    as_row = (copies.outcome == CONFLICTING) | ((copies.outcome == DUPLICATE) & quarantine_identical)
    hit_tasks = np.unique(rows.task[copies.outcome != KEEP])
    moved_out = []
    for task in hit_tasks.tolist():
        of_task = rows.task == task
        valid, late = of_task & ~rows.late, of_task & rows.late
        for day in np.unique(rows.day[valid & (copies.outcome != KEEP)]).tolist():
            at = np.flatnonzero(valid & (rows.day == day))  # the file's rows, in order
            hit = copies.outcome[at] != KEEP
            path = _raw_path(store, kind, run_id, day, rows.stems[task])
            table = pq.read_table(path)
            write_table_atomic(table.filter(pa.array(~hit)), path)
            out = np.flatnonzero(hit & as_row[at])
            chosen = at[out]
            moved_out.append(_as_quarantine(table.take(pa.array(out)), kind, reasons[chosen], details[chosen],
                                            rows.ids[chosen], rows.contents[chosen]))
        at = np.flatnonzero(late)  # the quarantine file's late rows, in order
        if (copies.outcome[at] != KEEP).any():
            path = store.root / QUARANTINE / f"{RUN_ID}={run_id}" / f"{kind.value}-{rows.stems[task]}.parquet"
            _remark_late(path, kind, copies.outcome[at], reasons[at], as_row[at], details[at])
    if moved_out:
        write_table_atomic(pa.concat_tables(moved_out),
                           store.root / QUARANTINE / f"{RUN_ID}={run_id}" / f"{kind.value}-copies.parquet")


def _remark_late(path: Path, kind: Kind, outcome: np.ndarray, reasons: np.ndarray, as_row: np.ndarray,
                 details: np.ndarray) -> None:
    """Re-mark the late rows of one quarantine file that are copies, dropping those that are not to
    stay as rows (``outcome``, ``reasons``, ``as_row`` and ``details`` are parallel to its late rows)."""
    table = pq.read_table(path)
    late_rows = np.flatnonzero(pc.equal(table[REASON], LATE).to_numpy(zero_copy_only=False))
    copy = outcome != KEEP
    mask = np.zeros(table.num_rows, bool)
    mask[late_rows[copy]] = True  # the copies' rows, in file order like their values below
    for name, values in ((REASON, reasons[copy]), (DETAIL, details[copy]),
                         (FIELD, np.full(int(copy.sum()), IDENTITY_BY_KIND[kind][0], object))):
        column = pc.replace_with_mask(table[name].combine_chunks(), pa.array(mask), pa.array(values, pa.string()))
        table = table.set_column(table.schema.get_field_index(name), name, column)
    keep = np.ones(table.num_rows, bool)
    keep[late_rows[copy]] = as_row[copy]
    write_table_atomic(table.filter(pa.array(keep)), path)
