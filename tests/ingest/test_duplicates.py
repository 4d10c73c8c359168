"""Copies of one event: the stored copy or the earliest in the run wins; identical content is a
duplicate, different content a conflicting duplicate; lateness never hides a copy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.contract import Kind
from pipeline.ingest.duplicates import CONFLICTING, DUPLICATE, KEEP, arrival_order, classify_copies
from pipeline.ingest.id_index import Matches
from pipeline.ingest.identity import identity_hashes

TS = pa.timestamp("us", tz="UTC")


def rows(items: list[tuple]) -> pa.Table:
    """items: (transaction_id, kafka time us or None, partition, offset)."""
    return pa.table({
        "transaction_id": [i[0] for i in items],
        "kafka_timestamp": pa.array([i[1] for i in items], pa.int64()).cast(TS),
        "partition": pa.array([i[2] for i in items], pa.int32()),
        "offset": pa.array([i[3] for i in items], pa.int64()),
    })


def nothing_stored(n: int) -> Matches:
    return Matches(np.zeros(n, bool), np.zeros(n, np.uint64), np.zeros(n, np.int32), np.zeros(n, np.int32))


def classify(table: pa.Table, contents: list[int], stored: Matches | None = None, kind=Kind.TRANSACTION):
    """classify_copies on ``table``'s rows, identities hashed from its identity columns of ``kind``."""
    n = table.num_rows
    return classify_copies(identity_hashes(table, kind), arrival_order(table["kafka_timestamp"]),
                           table["partition"].to_numpy(), table["offset"].to_numpy(), np.array(contents, np.uint64),
                           stored or nothing_stored(n))


def test_unique_identities_are_kept():
    copies = classify(rows([("a", 1, 0, 0), ("b", 1, 0, 1)]), [7, 7])
    assert copies.outcome.tolist() == [KEEP, KEEP]


def test_earliest_kafka_time_wins_then_partition_then_offset():
    table = rows([("a", 20, 0, 5), ("a", 10, 3, 9), ("b", 10, 2, 1), ("b", 10, 1, 7), ("c", 5, 0, 3), ("c", 5, 0, 2),
                  ("d", None, 0, 1), ("d", 99, 1, 50)])
    copies = classify(table, [1] * 8)
    assert copies.outcome.tolist() == [DUPLICATE, KEEP, DUPLICATE, KEEP, DUPLICATE, KEEP, DUPLICATE, KEEP]
    assert copies.first_row.tolist() == [1, -1, 3, -1, 5, -1, 7, -1]  # no timestamp sorts last
    assert not copies.first_in_store.any()


def test_a_copy_with_other_content_is_conflicting_and_the_first_copy_stays():
    copies = classify(rows([("a", 1, 0, 0), ("a", 2, 0, 1), ("a", 3, 0, 2)]), [10, 11, 10])
    assert copies.outcome.tolist() == [KEEP, CONFLICTING, DUPLICATE]
    assert copies.count(CONFLICTING) == 1 and copies.count(DUPLICATE) == 1


def test_stored_identities_make_every_copy_in_the_run_a_copy_judged_against_the_stored_content():
    table = rows([("a", 1, 0, 0), ("z", 1, 0, 1), ("z", 2, 0, 2), ("q", 5, 0, 3)])
    stored = Matches(np.array([True, False, False, True]), np.array([50, 0, 0, 60], np.uint64),
                     np.array([20000, 0, 0, 20001], np.int32), np.array([3, 0, 0, 4], np.int32))
    copies = classify(table, [50, 8, 8, 61], stored)
    assert copies.outcome.tolist() == [DUPLICATE, KEEP, DUPLICATE, CONFLICTING]
    assert copies.first_in_store.tolist() == [True, False, False, True]
    assert copies.first_row.tolist() == [-1, -1, 1, -1]


def test_every_copy_of_a_stored_event_is_judged_against_the_store_not_against_each_other():
    table = rows([("a", 1, 0, 0), ("a", 2, 0, 1)])
    stored = Matches(np.array([True, True]), np.array([9, 9], np.uint64), np.zeros(2, np.int32), np.zeros(2, np.int32))
    assert classify(table, [9, 4], stored).outcome.tolist() == [DUPLICATE, CONFLICTING]


def test_label_identity_includes_verdict_and_report_time():
    table = pa.table({
        "transaction_id": ["t1", "t1", "t1", "t2"],
        "is_fraud": [True, False, True, True],
        "reported_at": pa.array([100, 200, 100, 100], pa.int64()).cast(TS),
        "kafka_timestamp": pa.array([1, 2, 3, 4], pa.int64()).cast(TS),
        "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array([0, 1, 2, 3], pa.int64()),
    })
    stored = Matches(np.array([False, False, False, True]), np.array([0, 0, 0, 5], np.uint64),
                     np.zeros(4, np.int32), np.zeros(4, np.int32))
    copies = classify(table, [1, 2, 1, 5], stored, Kind.LABEL)
    # t1 fraud then cleared: two reports, both kept; the repeated fraud report is a duplicate.
    assert copies.outcome.tolist() == [KEEP, KEEP, DUPLICATE, DUPLICATE]
