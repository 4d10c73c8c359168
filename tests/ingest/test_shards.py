"""Shard files: deterministic bytes, sorted rows, the manifest's column contract."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.layout import shard_relpath
from pipeline.datasets.manifest import ID_COLUMNS, LABEL_COLUMN, REPORTED_AT_COLUMN, ShardInfo
from pipeline.features.definitions import CATEGORICAL_FEATURES, NUMERIC_FEATURES
from pipeline.ingest.shards import SHARD_SCHEMA, write_empty_shards, write_shard_file


def shard_table(n: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    t0 = datetime(2026, 1, 5, tzinfo=UTC)
    rows = {"transaction_id": [f"t-{i:04d}" for i in range(n)], "card_id": [f"c-{i % 7}" for i in range(n)],
            "event_time": [t0 + timedelta(seconds=rng.randint(0, 86_000)) for _ in range(n)]}
    rows.update({name: [rng.random() for _ in range(n)] for name in NUMERIC_FEATURES})
    rows.update({name: [rng.randint(0, 9) for _ in range(n)] for name in CATEGORICAL_FEATURES})
    rows[LABEL_COLUMN] = [int(rng.random() < 0.1) for _ in range(n)]
    rows[REPORTED_AT_COLUMN] = pa.array([t + timedelta(days=2) if label else None
                                         for t, label in zip(rows["event_time"], rows[LABEL_COLUMN], strict=True)],
                                        pa.timestamp("us", tz="UTC"))
    return pa.table(rows)


def test_same_rows_in_any_order_give_identical_bytes(tmp_path):
    table = shard_table(300, seed=1)
    shuffled = table.take(pa.array(random.Random(2).sample(range(300), 300)))
    a = write_shard_file(table, tmp_path / "a.parquet")
    b = write_shard_file(shuffled, tmp_path / "b.parquet")
    assert a == b  # rows, frauds, sha256
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert a[1] == sum(table[LABEL_COLUMN].to_pylist())


def test_shard_holds_ids_features_and_label_sorted_by_time(tmp_path):
    write_shard_file(shard_table(50, seed=3), tmp_path / "s.parquet")
    out = pq.read_table(tmp_path / "s.parquet")
    assert out.schema.equals(SHARD_SCHEMA)
    assert tuple(out.column_names[:3]) == ID_COLUMNS and out.column_names[-2:] == [LABEL_COLUMN, REPORTED_AT_COLUMN]
    keys = list(zip(out["event_time"].to_pylist(), out["transaction_id"].to_pylist(), strict=True))
    assert keys == sorted(keys)


def test_missing_slots_get_empty_shards_so_every_date_has_all(tmp_path):
    written = [ShardInfo(shard_relpath("2026-01-05", 1), "2026-01-05", 1, 10, 0, "x")]
    empty = write_empty_shards(tmp_path, ["2026-01-05", "2026-01-06"], 4, written)
    assert sorted((s.date, s.shard) for s in empty) == [("2026-01-05", 0), ("2026-01-05", 2), ("2026-01-05", 3),
                                                        ("2026-01-06", 0), ("2026-01-06", 1), ("2026-01-06", 2),
                                                        ("2026-01-06", 3)]
    assert pq.read_table(tmp_path / empty[0].path).num_rows == 0
    assert len({s.sha256 for s in empty}) == 1  # an empty shard is always the same bytes
