"""Copies of one event: one enters the raw store, every other is a duplicate, whatever its time.

Kafka delivers at least once: a payment switch resends a batch after a timeout, a repeated
backfill republishes a day. So a record whose identity (:mod:`pipeline.ingest.identity`) the raw
store already holds, or that an earlier record of the same run had, is

* ``DUPLICATE`` when its content equals the first copy's (an identical resend), or
* ``CONFLICTING_DUPLICATE`` when it differs: the first copy stays in the raw store, this one is
  quarantined with a detail naming where the first one is, so both versions can be found;

never ``LATE_EVENT``: duplicates are classified before lateness. Records the contract or the
future-time screen refused are not copies of anything (they never were events).

Within one run the first copy is the one with the smallest ``(Kafka timestamp, partition,
offset)`` (a missing timestamp sorts last); if that copy is late, it stays ``LATE_EVENT`` and the
later copies are still duplicates of it. The partition watermark that decides lateness counts
every record the contract and the future screen accepted, duplicates included (their times are
times the partition has seen), so lateness never depends on this classification.

:func:`classify_copies` is pure (numpy and Arrow over the run's identity columns and hashes); the
history check behind it is one look-up in the identity index, O(this run's records).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind
from pipeline.ingest.id_index import Matches
from pipeline.ingest.identity import IDENTITY_BY_KIND

ARRIVAL = "kafka_timestamp"
KEEP, DUPLICATE, CONFLICTING = 0, 1, 2  # outcome codes: keep the landing verdict (valid or late), or a copy


@dataclass(frozen=True)
class Copies:
    """The classification of one run's accepted-or-late records (parallel to the input rows)."""

    outcome: np.ndarray  # int8: KEEP, DUPLICATE or CONFLICTING
    first_in_store: np.ndarray  # bool: the first copy is in the raw store (else earlier in this run)
    first_row: np.ndarray  # int64: for copies whose first is in this run, that row; else -1

    def count(self, code: int, mask: np.ndarray | None = None) -> int:
        hit = self.outcome == code
        return int((hit & mask).sum() if mask is not None else hit.sum())


def classify_copies(rows: pa.Table, kind: Kind, ids: np.ndarray, contents: np.ndarray, stored: Matches) -> Copies:
    """Classify ``rows`` (identity columns, ``kafka_timestamp``, ``partition``, ``offset``) of one
    run, with their identity and content hashes and the identity index's ``stored`` matches."""
    n = rows.num_rows
    outcome = np.zeros(n, np.int8)
    first_row = np.full(n, -1, np.int64)
    in_store = stored.found
    outcome[in_store] = np.where(contents[in_store] == stored.contents[in_store], DUPLICATE, CONFLICTING)
    if n == 0:
        return Copies(outcome, in_store, first_row)
    keys = list(IDENTITY_BY_KIND[kind])
    arrival = pc.fill_null(pc.cast(rows[ARRIVAL], pa.int64()), 2**62)  # no timestamp: sorts last
    ordered = pa.table({**{k: rows[k] for k in keys}, "_arrival": arrival, "partition": rows["partition"],
                        "offset": rows["offset"], "_row": pa.array(np.arange(n))})
    ordered = ordered.sort_by([(k, "ascending") for k in keys]
                              + [("_arrival", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
    same = np.ones(n - 1, bool)
    for k in keys:
        column = ordered[k].combine_chunks()
        same &= pc.fill_null(pc.equal(column[1:], column[:-1]), False).to_numpy(zero_copy_only=False)
    row = ordered["_row"].to_numpy()
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    group_first = row[starts[np.cumsum(np.concatenate([[True], ~same])) - 1]]
    later = (group_first != row) & ~in_store[row]
    copies, firsts = row[later], group_first[later]
    outcome[copies] = np.where(contents[copies] == contents[firsts], DUPLICATE, CONFLICTING)
    first_row[copies] = firsts
    return Copies(outcome, in_store, first_row)
