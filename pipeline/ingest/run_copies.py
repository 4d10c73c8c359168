"""Find and move the copies within one run (:mod:`pipeline.ingest.duplicates`) in its landed files.

The read tasks landed the run's records as valid (raw files) or refused (quarantine files), and
refused the copies of stored events already. On the driver, before the commit, this module reads
the rows that can still be copies (every valid row, and the rows refused as ``LATE_EVENT``),
classifies them in one frame (a copy of another read task's record is only visible here), and
rewrites the run's files from that same frame, only where a copy was found:

* a valid row that is a copy leaves its raw file for ``quarantine/run_id=R/<kind>-copies.parquet``;
* a late row that is a copy is re-marked in its quarantine file (``DUPLICATE`` or
  ``CONFLICTING_DUPLICATE`` instead of ``LATE_EVENT``);
* identical copies are dropped instead of quarantined when ``[raw] quarantine_duplicates = false``
  (they are still counted).

:class:`RunCopies` returns the moves that the accounting applies to the read tasks' counts, and
the index entries of the rows that stay valid (a transaction's entry id is what a label's
``transaction_id`` hashes to: orphan labels are checked against them). Nothing here is visible before the commit: a
killed run leaves uncommitted files, which the next run deletes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract import FIELDS_BY_KIND, TIME_FIELD_BY_KIND, Kind, RejectReason
from pipeline.ingest.accounting import CopyMoves
from pipeline.ingest.duplicates import (
    ARRIVAL,
    CONFLICTING,
    DUPLICATE,
    KEEP,
    LATE,
    Copies,
    classify_copies,
    run_copy_details,
)
from pipeline.ingest.id_index import Entries, Matches
from pipeline.ingest.identity import IDENTITY, IDENTITY_BY_KIND, content_hashes, from_int64, identity_hashes
from pipeline.ingest.raw_layout import (
    PAYLOAD,
    QUARANTINE,
    RUN_ID,
    RawStore,
    quarantine_arrow_schema,
    write_table_atomic,
)
from pipeline.ingest.timing import LATENESS_SCREENED
from pipeline.ingest.validate import DETAIL, FIELD, REASON

POSITION = ("partition", "offset")


@dataclass(frozen=True)
class RunCopies:
    moves: CopyMoves
    kept: Entries  # index entries of the rows that stay valid

    @staticmethod
    def none() -> RunCopies:
        return RunCopies(CopyMoves(), Entries.empty())


@dataclass(frozen=True)
class _Source:
    """Rows read from the run's files, with the file and row range each came from."""

    rows: pa.Table
    files: list[tuple[Path, int, int]]  # (file, first row, end row) in ``rows``


def _read(paths: list[Path], columns: list[str], late_only: bool) -> _Source:
    tables, files, at = [], [], 0
    for path in paths:
        table = pq.read_table(path, columns=columns + ([REASON] if late_only else []))
        if late_only:
            table = table.filter(pc.equal(table[REASON], LATE)).drop_columns([REASON])
        files.append((path, at, at + table.num_rows))
        tables.append(table)
        at += table.num_rows
    return _Source(pa.concat_tables(tables) if tables else None, files)


def _as_quarantine(rows: pa.Table, kind: Kind, reasons: np.ndarray, details: list[str],
                   ids: np.ndarray, contents: np.ndarray) -> pa.Table:
    n = rows.num_rows
    columns = {"kind": pa.repeat(kind.value, n), "value": rows[PAYLOAD].cast(pa.binary()),
               REASON: pa.array(reasons, pa.string()), FIELD: pa.repeat(IDENTITY_BY_KIND[kind][0], n),
               DETAIL: pa.array(details, pa.string()), "id_hash": pa.array(ids["h1"].view(np.int64)),
               "content_hash": pa.array(contents.view(np.int64))}
    schema = quarantine_arrow_schema()
    return pa.table([columns[f.name] if f.name in columns else rows[f.name] for f in schema], schema=schema)


def _details(rows: pa.Table, late_from: int, copies: Copies) -> np.ndarray:
    """The quarantine detail of each copy (object array parallel to ``rows``; None where no copy)."""
    details = np.full(rows.num_rows, None, object)
    hit = np.flatnonzero(copies.outcome)
    if len(hit):
        first = copies.first_row[hit]
        details[hit] = run_copy_details(copies.outcome[hit] == DUPLICATE, rows["partition"].to_numpy()[first],
                                        rows["offset"].to_numpy()[first],
                                        first < late_from).to_numpy(zero_copy_only=False)
    return details


def settle_copies(store: RawStore, kind: Kind, run_id: str, run_ordinal: int, quarantine_identical: bool) -> RunCopies:
    """Classify and move the copies among run ``run_id``'s landed rows of ``kind`` (see module doc);
    ``run_ordinal`` is the run's position in the commit log once committed (its index entries')."""
    identity = list(IDENTITY_BY_KIND[kind])
    fields = [s.name for s in FIELDS_BY_KIND[kind]]
    raw_paths, quarantine_paths = store.run_files(run_id, kind)
    raw = _read(raw_paths, [*fields, ARRIVAL, *POSITION], late_only=False)
    # Only screened kinds have late rows; their identity (transaction_id) is a quarantine column.
    late = _read(quarantine_paths, [*identity, "content_hash", ARRIVAL, *POSITION],
                 late_only=True) if kind in LATENESS_SCREENED else _Source(None, [])
    # One frame: the valid rows first, then the late ones (a night of old resends has only late rows).
    n_raw = raw.rows.num_rows if raw.rows is not None else 0
    frames, contents = [], []
    ids = identity_hashes(raw.rows, kind) if n_raw else np.zeros(0, IDENTITY)  # valid rows' (late: never indexed)
    if n_raw:
        frames.append(raw.rows.select([*identity, ARRIVAL, *POSITION]))
        contents.append(content_hashes(raw.rows, kind))
    if late.rows is not None and late.rows.num_rows:
        late_rows = late.rows.select([*identity, ARRIVAL, *POSITION])
        frames.append(late_rows.cast(frames[0].schema) if frames else late_rows)
        contents.append(from_int64(late.rows["content_hash"]))
    if not frames:
        return RunCopies.none()
    rows, contents = pa.concat_tables(frames), np.concatenate(contents)
    # The read tasks refused copies of stored events: what is left can only copy this run's own.
    copies = classify_copies(rows, kind, contents, Matches.none(len(contents)))
    details = _details(rows, n_raw, copies)
    reasons = np.where(copies.outcome == DUPLICATE, RejectReason.DUPLICATE.value,
                       RejectReason.CONFLICTING_DUPLICATE.value).astype(object)
    # Which copies become quarantine rows: all of them, or only the conflicting ones.
    as_row = (copies.outcome == CONFLICTING) | ((copies.outcome == DUPLICATE) & quarantine_identical)

    moved_out = []
    for path, lo, hi in raw.files:
        hit = copies.outcome[lo:hi] != KEEP
        if not hit.any():
            continue
        table = pq.read_table(path)
        write_table_atomic(table.filter(pa.array(~hit)), path)
        rows_out = np.flatnonzero(hit & as_row[lo:hi])
        at = rows_out + lo
        moved_out.append(_as_quarantine(table.take(pa.array(rows_out)), kind, reasons[at],
                                        details[at], ids[at], contents[at]))
    if moved_out:
        write_table_atomic(pa.concat_tables(moved_out),
                           store.root / QUARANTINE / f"{RUN_ID}={run_id}" / f"{kind.value}-copies.parquet")
    for path, lo, hi in late.files:
        span = slice(n_raw + lo, n_raw + hi)
        if (copies.outcome[span] != KEEP).any():
            _remark_late(path, kind, copies.outcome[span], reasons[span], as_row[span], details[span])

    is_raw = np.arange(len(contents)) < n_raw
    kept = np.flatnonzero(is_raw & (copies.outcome == KEEP))
    days = (pc.cast(raw.rows[TIME_FIELD_BY_KIND[kind]], pa.date32()).cast(pa.int32()).to_numpy(zero_copy_only=False)
            if n_raw else np.zeros(0, np.int32))
    moves = CopyMoves(copies.count(DUPLICATE, is_raw), copies.count(CONFLICTING, is_raw),
                      copies.count(DUPLICATE, ~is_raw), copies.count(CONFLICTING, ~is_raw))
    entries = Entries(ids[kept], contents[kept], days[kept].astype(np.int32), np.full(len(kept), run_ordinal, np.int32))
    return RunCopies(moves, entries)


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
