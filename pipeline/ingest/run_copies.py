"""Find and move one run's copies (:mod:`pipeline.ingest.duplicates`) in its landed files.

The read tasks landed the run's records as valid (raw files) or refused (quarantine files). On
the driver, before the commit, this module reads the rows that can be copies (every valid row,
and the rows refused as ``LATE_EVENT``), classifies them in one frame against the identity index
and this run, and rewrites the run's files from that same frame:

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
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract import FIELDS_BY_KIND, TIME_FIELD_BY_KIND, Kind, RejectReason
from pipeline.ingest.accounting import CopyMoves
from pipeline.ingest.duplicates import ARRIVAL, CONFLICTING, DUPLICATE, KEEP, Copies, classify_copies
from pipeline.ingest.id_index import Entries
from pipeline.ingest.identity import IDENTITY_BY_KIND, content_hashes, from_int64, identity_hashes
from pipeline.ingest.raw_store import (
    DATE_COLUMN_BY_KIND,
    PAYLOAD,
    QUARANTINE,
    RUN_ID,
    TABLE_BY_KIND,
    RawStore,
    quarantine_arrow_schema,
    write_table_atomic,
)
from pipeline.ingest.timing import LATENESS_SCREENED
from pipeline.ingest.validate import DETAIL, FIELD, REASON

POSITION = ("partition", "offset")
LATE = RejectReason.LATE_EVENT.value
EPOCH = date(1970, 1, 1)


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
               DETAIL: pa.array(details, pa.string()), "id_hash": pa.array(ids.view(np.int64)),
               "content_hash": pa.array(contents.view(np.int64))}
    schema = quarantine_arrow_schema()
    return pa.table([columns[f.name] if f.name in columns else rows[f.name] for f in schema], schema=schema)


class _Details:
    """The quarantine detail of each copy: where its first copy is, so both can be found."""

    def __init__(self, store: RawStore, kind: Kind, rows: pa.Table, late_from: int) -> None:
        self.kind, self.runs, self.late_from = kind, store.committed().runs, late_from
        self.partition, self.offset = rows["partition"].to_numpy(), rows["offset"].to_numpy()

    def __call__(self, copies: Copies, stored_days: np.ndarray, stored_runs: np.ndarray, i: int) -> str:
        what = "an identical copy" if copies.outcome[i] == DUPLICATE else "a different version"
        if copies.first_in_store[i]:
            day = EPOCH + timedelta(days=int(stored_days[i]))
            where = (f"is in the raw store: {TABLE_BY_KIND[self.kind]}/{DATE_COLUMN_BY_KIND[self.kind]}={day}/"
                     f"{RUN_ID}={self.runs[stored_runs[i]]}")
        else:
            j = copies.first_row[i]
            state = "kept" if j < self.late_from else f"quarantined as {LATE}"
            where = f"came first in this run at partition {self.partition[j]} offset {self.offset[j]} ({state})"
        return f"{what} of this event {where}"


def settle_copies(store: RawStore, kind: Kind, run_id: str, run_ordinal: int, quarantine_identical: bool) -> RunCopies:
    """Classify and move the copies among run ``run_id``'s landed rows of ``kind`` (see module doc);
    ``run_ordinal`` is the run's position in the commit log once committed (its index entries')."""
    identity = list(IDENTITY_BY_KIND[kind])
    fields = [s.name for s in FIELDS_BY_KIND[kind]]
    raw_paths, quarantine_paths = store.run_files(run_id, kind)
    raw = _read(raw_paths, [*fields, ARRIVAL, *POSITION], late_only=False)
    # Only screened kinds have late rows; their identity (transaction_id) is a quarantine column.
    late = _read(quarantine_paths, [*identity, "id_hash", "content_hash", ARRIVAL, *POSITION],
                 late_only=True) if kind in LATENESS_SCREENED else _Source(None, [])
    if raw.rows is None:
        return RunCopies.none()
    n_raw = raw.rows.num_rows
    ids, contents = identity_hashes(raw.rows, kind), content_hashes(raw.rows, kind)
    rows = raw.rows.select([*identity, ARRIVAL, *POSITION])
    if late.rows is not None and late.rows.num_rows:
        ids = np.concatenate([ids, from_int64(late.rows["id_hash"])])
        contents = np.concatenate([contents, from_int64(late.rows["content_hash"])])
        rows = pa.concat_tables([rows, late.rows.select([*identity, ARRIVAL, *POSITION]).cast(rows.schema)])
    stored = store.id_index(kind).lookup(ids)
    copies = classify_copies(rows, kind, ids, contents, stored)
    describe = _Details(store, kind, rows, n_raw)
    details = {int(i): describe(copies, stored.days, stored.runs, int(i)) for i in np.flatnonzero(copies.outcome)}
    reason_of = {DUPLICATE: RejectReason.DUPLICATE.value, CONFLICTING: RejectReason.CONFLICTING_DUPLICATE.value}
    # Which copies become quarantine rows: all of them, or only the conflicting ones.
    quarantined = (lambda code: code != KEEP) if quarantine_identical else (lambda code: code == CONFLICTING)

    moved_out = []
    for path, lo, hi in raw.files:
        codes = copies.outcome[lo:hi]
        if not codes.any():
            continue
        table = pq.read_table(path)
        hit = codes != KEEP
        write_table_atomic(table.filter(pa.array(~hit)), path)
        keep_as_row = np.array([quarantined(c) for c in codes[hit]], bool)
        rows_hit = np.flatnonzero(hit)[keep_as_row] + lo
        moved_out.append(_as_quarantine(table.filter(pa.array(hit)).filter(pa.array(keep_as_row)), kind,
                                        np.array([reason_of[c] for c in copies.outcome[rows_hit]], object),
                                        [details[int(i)] for i in rows_hit], ids[rows_hit], contents[rows_hit]))
    if moved_out:
        write_table_atomic(pa.concat_tables(moved_out),
                           store.root / QUARANTINE / f"{RUN_ID}={run_id}" / f"{kind.value}-copies.parquet")
    for path, lo, hi in late.files:
        codes = copies.outcome[n_raw + lo:n_raw + hi]
        if codes.any():
            _remark_late(path, codes, [details.get(n_raw + lo + k) for k in range(hi - lo)], reason_of, quarantined)

    is_raw = np.arange(len(ids)) < n_raw
    kept = np.flatnonzero(is_raw & (copies.outcome == KEEP))
    days = pc.cast(raw.rows[TIME_FIELD_BY_KIND[kind]], pa.date32()).cast(pa.int32()).to_numpy(zero_copy_only=False)
    moves = CopyMoves(copies.count(DUPLICATE, is_raw), copies.count(CONFLICTING, is_raw),
                      copies.count(DUPLICATE, ~is_raw), copies.count(CONFLICTING, ~is_raw))
    entries = Entries(ids[kept], contents[kept], days[kept].astype(np.int32), np.full(len(kept), run_ordinal, np.int32))
    return RunCopies(moves, entries)


def _remark_late(path: Path, codes: np.ndarray, details: list[str | None], reason_of: dict, quarantined) -> None:
    """Re-mark the late rows of one quarantine file that are copies (or drop identical ones)."""
    table = pq.read_table(path)
    late_rows = np.flatnonzero(pc.equal(table[REASON], LATE).to_numpy(zero_copy_only=False))
    reasons = table[REASON].to_numpy(zero_copy_only=False).astype(object)
    detail = table[DETAIL].to_numpy(zero_copy_only=False).astype(object)
    field = table[FIELD].to_numpy(zero_copy_only=False).astype(object)
    keep = np.ones(table.num_rows, bool)
    for k, code in enumerate(codes):
        if code == KEEP:
            continue
        row = late_rows[k]
        reasons[row], detail[row], field[row] = reason_of[code], details[k], "transaction_id"
        keep[row] = quarantined(code)
    for name, values in ((REASON, reasons), (DETAIL, detail), (FIELD, field)):
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, pa.string()))
    write_table_atomic(table.filter(pa.array(keep)), path)
