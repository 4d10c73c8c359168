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

Both kinds of copy are settled on the driver after the read tasks landed the run
(:mod:`pipeline.ingest.run_copies`), from the hashes the tasks wrote beside their files: which
records the store already holds comes from the identity index looked up shard by shard
(:mod:`pipeline.ingest.store_copies`), and :func:`classify_copies` finds the copies *within* the
run, which no single read task can see. Only the landed files that hold a copy are rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind, RejectReason
from pipeline.ingest.id_index import Matches
from pipeline.ingest.raw_layout import DATE_COLUMN_BY_KIND, RUN_ID, TABLE_BY_KIND

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


def arrival_order(times: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Kafka timestamps as the int64 the first copy is chosen by (a missing one sorts last)."""
    return pc.fill_null(pc.cast(times, pa.int64()), 2**62).to_numpy(zero_copy_only=False)


def classify_copies(ids: np.ndarray, arrival: np.ndarray, partition: np.ndarray, offset: np.ndarray,
                    contents: np.ndarray, stored: Matches) -> Copies:
    """Classify one run's records from their identity hashes (:data:`~pipeline.ingest.identity.IDENTITY`),
    :func:`arrival_order`, Kafka positions and content hashes, with the identity index's ``stored``
    matches. Copies within the run are found on the 128-bit identities, as the index finds stored ones."""
    n = len(ids)
    outcome = np.zeros(n, np.int8)
    first_row = np.full(n, -1, np.int64)
    in_store = stored.found
    outcome[in_store] = np.where(contents[in_store] == stored.contents[in_store], DUPLICATE, CONFLICTING)
    if n == 0:
        return Copies(outcome, in_store, first_row)
    row = np.lexsort((offset, partition, arrival, ids["h2"], ids["h1"]))
    ordered = ids[row]
    same = (ordered["h1"][1:] == ordered["h1"][:-1]) & (ordered["h2"][1:] == ordered["h2"][:-1])
    starts = np.flatnonzero(np.concatenate([[True], ~same]))
    group_first = row[starts[np.cumsum(np.concatenate([[True], ~same])) - 1]]
    later = (group_first != row) & ~in_store[row]
    copies, firsts = row[later], group_first[later]
    outcome[copies] = np.where(contents[copies] == contents[firsts], DUPLICATE, CONFLICTING)
    first_row[copies] = firsts
    return Copies(outcome, in_store, first_row)


LATE = RejectReason.LATE_EVENT.value
COPY_REASONS = (RejectReason.DUPLICATE.value, RejectReason.CONFLICTING_DUPLICATE.value)


def _what(identical: np.ndarray) -> pa.Array:
    return pa.array(np.where(identical, "an identical copy", "a different version"))


def stored_copy_details(kind: Kind, identical: np.ndarray, days: np.ndarray, run_ids: np.ndarray) -> pa.Array:
    """The quarantine detail of copies whose first copy is stored: where it is (column-wise: a
    night of resends has as many details as resends)."""
    day = pc.cast(pa.array(days.astype(np.int32)).cast(pa.date32()), pa.string())
    return pc.binary_join_element_wise(
        _what(identical), f" of this event is in the raw store: {TABLE_BY_KIND[kind]}/{DATE_COLUMN_BY_KIND[kind]}=",
        day, f"/{RUN_ID}=", pa.array(run_ids, pa.string()), "")


def run_copy_details(identical: np.ndarray, partition: np.ndarray, offset: np.ndarray,
                     first_kept: np.ndarray) -> pa.Array:
    """The quarantine detail of copies whose first copy came earlier in this run: its position."""
    as_text = lambda values: pc.cast(pa.array(values), pa.string())  # noqa: E731
    state = pa.array(np.where(first_kept, "kept", f"quarantined as {LATE}"))
    return pc.binary_join_element_wise(
        _what(identical), " of this event came first in this run at partition ", as_text(partition), " offset ",
        as_text(offset), " (", state, ")", "")
