"""First arrival wins: within a run by (Kafka time, topic, partition, offset); stored copies first."""

from __future__ import annotations

import pyarrow as pa

from pipeline.contract import Kind
from pipeline.ingest.duplicates import find_duplicates


def rows(items: list[tuple]) -> pa.Table:
    """items: (transaction_id, kafka time us or None, partition, offset)."""
    return pa.table({
        "transaction_id": [i[0] for i in items],
        "kafka_timestamp": pa.array([i[1] for i in items], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "topic": ["tx"] * len(items),
        "partition": pa.array([i[2] for i in items], pa.int32()),
        "offset": pa.array([i[3] for i in items], pa.int64()),
    })


NOTHING_STORED = pa.table({"transaction_id": pa.array([], pa.string())})


def test_unique_identities_have_no_duplicates():
    assert find_duplicates(rows([("a", 1, 0, 0), ("b", 1, 0, 1)]), NOTHING_STORED, Kind.TRANSACTION) == set()


def test_earliest_kafka_time_wins_then_partition_then_offset():
    new = rows([("a", 20, 0, 5), ("a", 10, 3, 9), ("b", 10, 2, 1), ("b", 10, 1, 7), ("c", 5, 0, 3), ("c", 5, 0, 2),
                ("d", None, 0, 1), ("d", 99, 1, 50)])
    dups = find_duplicates(new, NOTHING_STORED, Kind.TRANSACTION)
    assert dups == {("tx", 0, 5), ("tx", 2, 1), ("tx", 0, 3), ("tx", 0, 1)}  # no timestamp sorts last


def test_identities_already_stored_are_duplicates_even_when_alone():
    new = rows([("a", 1, 0, 0), ("z", 1, 0, 1), ("z", 2, 0, 2)])
    stored = pa.table({"transaction_id": ["a", "q"]})
    assert find_duplicates(new, stored, Kind.TRANSACTION) == {("tx", 0, 0), ("tx", 0, 2)}


def test_label_identity_includes_verdict_and_report_time():
    ts = pa.timestamp("us", tz="UTC")
    new = pa.table({
        "transaction_id": ["t1", "t1", "t1", "t2"],
        "is_fraud": [True, False, True, True],
        "reported_at": pa.array([100, 200, 100, 100], pa.int64()).cast(ts),
        "kafka_timestamp": pa.array([1, 2, 3, 4], pa.int64()).cast(ts),
        "topic": ["l"] * 4, "partition": pa.array([0] * 4, pa.int32()), "offset": pa.array([0, 1, 2, 3], pa.int64()),
    })
    stored = pa.table({"transaction_id": ["t2"], "is_fraud": [True],
                       "reported_at": pa.array([100], pa.int64()).cast(ts)})
    # t1 fraud then cleared: two reports, both kept; the repeated fraud report is a duplicate.
    assert find_duplicates(new, stored, Kind.LABEL) == {("l", 0, 2), ("l", 0, 3)}
