"""The pure parts of the Spark feature passes: regrouping batches into whole (key, chunk) groups and
cutting a hot key into chunks (the Spark runs: tests/ingest/test_feature_update_spark.py)."""

from __future__ import annotations

import pyarrow as pa

from pipeline.features.spark_kernel import CHUNK, chunk_starts, complete_key_tables

HOUR = 3_600_000_000


def test_a_hot_keys_chunks_hold_whole_hours_of_at_most_the_limit():
    buckets = [(0, 10), (HOUR, 25), (2 * HOUR, 5), (3 * HOUR, 90), (4 * HOUR, 1)]
    assert chunk_starts(buckets, 40) == [3 * HOUR, 4 * HOUR]  # 10+25+5 | 90 (alone, above the limit) | 1
    assert chunk_starts(buckets, 35) == [2 * HOUR, 3 * HOUR, 4 * HOUR]  # 10+25 | 5 | 90 | 1
    assert chunk_starts(buckets, 1_000) == []  # not hot: one chunk
    assert chunk_starts([], 40) == []


def test_tables_hold_whole_key_chunk_groups_however_the_batches_cut_them():
    keys = ["a"] * 5 + ["b"] * 7 + ["c"] * 2
    chunks = [0] * 5 + [0, 0, 0, 1, 1, 1, 1] + [0, 0]
    table = pa.table({"card_id": keys, CHUNK: pa.array(chunks, pa.int32()), "row": range(len(keys))})
    batches = table.to_batches(max_chunksize=3)
    out = list(complete_key_tables(iter(batches), ("card_id", CHUNK), min_rows=4))
    assert pa.concat_tables(out).column("row").to_pylist() == list(range(len(keys)))  # every row once, in order
    groups = [set(zip(t.column("card_id").to_pylist(), t.column(CHUNK).to_pylist(), strict=True)) for t in out]
    assert len(out) > 1
    for i, first in enumerate(groups):  # a group never continues into another table
        for second in groups[i + 1:]:
            assert not first & second
