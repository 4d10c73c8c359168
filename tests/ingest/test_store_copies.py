"""The identity index looked up shard by shard: a read task's probe is its hashes sorted, a lookup task
maps only its buckets' shards, and the lookups on Spark and on the driver find what the index holds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.contract import Kind
from pipeline.ingest.id_index import BUCKETS, Entries, IdIndex, bucket_of
from pipeline.ingest.identity import IDENTITY, from_int64
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.store_copies import StoreLookup, bucket_ranges, lookup_buckets, probe_path
from tests.ingest.corpus import tx
from tests.ingest.test_run_copies import NEW_TIME, RUN, identity, land_task


def hash_ids(path: Path) -> np.ndarray:
    table = pq.read_table(path)
    ids = np.empty(table.num_rows, IDENTITY)
    ids["h1"], ids["h2"] = from_int64(table["id_h1"]), from_int64(table["id_h2"])
    return ids


@pytest.fixture
def landed(tmp_path) -> tuple[RawStore, IdIndex, list[Path]]:
    """Two read tasks' landing (300 payments) and an index of two segments holding 120 of them, and
    200 payments the run does not have."""
    payments = [tx(transaction_id=f"t-{i}", event_time=NEW_TIME) for i in range(300)]
    land_task(tmp_path, 0, payments[:170], [1] * 170)
    land_task(tmp_path, 1, payments[170:], [1] * 130)
    elsewhere = [tx(transaction_id=f"other-{i}", event_time=NEW_TIME) for i in range(200)]
    index = IdIndex(tmp_path / "_index", [])
    for run, chosen in enumerate((payments[::5] + elsewhere[:100], payments[1::5] + elsewhere[100:])):
        ids, contents = identity(chosen)
        n = len(ids)
        index = IdIndex(index.root, index.with_segment(f"{run:06d}-{run:06d}", Entries(
            ids, contents, np.full(n, 19_791 + run, np.int32), np.full(n, run, np.int32))))
    store = RawStore(tmp_path)
    return store, index, store.run_hash_files(RUN, Kind.TRANSACTION)


def test_a_read_tasks_probe_is_its_hashes_sorted_with_their_positions(landed):
    _, _, hash_files = landed
    for path in hash_files:
        probe, ids = np.load(probe_path(path)), hash_ids(path)
        assert probe.shape == (3, len(ids)) and np.all(np.diff(probe[0]) >= 0)
        positions = probe[2].astype(int)
        assert sorted(positions) == list(range(len(ids)))
        assert (ids["h1"][positions] == probe[0]).all() and (ids["h2"][positions] == probe[1]).all()


def test_bucket_ranges_cover_every_bucket_once():
    for tasks in (1, 3, 5, 16, 40):
        ranges = bucket_ranges(tasks)
        assert ranges[0][0] == 0 and ranges[-1][1] == BUCKETS and len(ranges) == min(tasks, BUCKETS)
        assert all(a < b and b == c for (a, b), (c, _) in zip(ranges, ranges[1:] + [(ranges[-1][1], 0)], strict=True))


def test_a_lookup_task_maps_only_its_buckets_shards(landed):
    _, index, hash_files = landed
    ids = np.concatenate([hash_ids(p) for p in hash_files])
    truth = index.lookup(ids)
    assert truth.found.sum() == 120
    first, last = 4, 9
    # The other buckets' shards are gone: a task that mapped any of them would fail.
    for segment in index.segments:
        for bucket in [*range(first), *range(last, BUCKETS)]:
            (index.root / segment / f"bucket-{bucket:02d}.npy").unlink()
    found = lookup_buckets(str(index.root), index.segments, [str(probe_path(p)) for p in hash_files], first, last)

    offsets = np.concatenate([[0], np.cumsum([len(hash_ids(p)) for p in hash_files])])
    rows = offsets[found["probe"].to_numpy()] + found["row"].to_numpy()
    in_range = (bucket_of(ids["h1"]) >= first) & (bucket_of(ids["h1"]) < last)
    assert 0 < len(rows) < truth.found.sum()
    assert sorted(rows.tolist()) == np.flatnonzero(truth.found & in_range).tolist()
    assert (found["content"].to_numpy().view(np.uint64) == truth.contents[rows]).all()
    assert (found["day"].to_numpy() == truth.days[rows]).all() and (found["run"].to_numpy() == truth.runs[rows]).all()


@pytest.mark.spark
def test_the_lookup_on_spark_tasks_and_on_the_driver_find_what_the_index_holds(landed, spark):
    _, index, hash_files = landed
    truth = index.lookup(np.concatenate([hash_ids(p) for p in hash_files]))
    for lookup in (StoreLookup(), StoreLookup(spark, tasks=5), StoreLookup(spark, tasks=1)):
        matches = lookup.matches(index, hash_files)
        for field in ("found", "contents", "days", "runs"):
            assert (getattr(matches, field) == getattr(truth, field)).all(), (lookup.tasks, field)
    assert StoreLookup(spark).matches(IdIndex(index.root, []), hash_files).found.sum() == 0  # nothing committed
