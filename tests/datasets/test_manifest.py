"""Publishing protocol of datasets: manifests last and atomic, readers trust only manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from pipeline.datasets.layout import manifest_path, shard_path
from pipeline.datasets.manifest import (
    DatasetManifest,
    DateWindow,
    ManifestError,
    ShardInfo,
    content_hash,
    file_sha256,
    load_manifest,
    publish_manifest,
)
from pipeline.datasets.reader import read_split, read_window


def _write_shard(root: Path, date: str, shard: int, rows: int, frauds: int) -> ShardInfo:
    rel = shard_path("v1", date, shard)
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    labels = [1] * frauds + [0] * (rows - frauds)
    pd.DataFrame({"transaction_id": [f"{date}-{shard}-{i}" for i in range(rows)], "x": range(rows),
                  "label": labels}).to_parquet(path)
    return ShardInfo(path=rel, date=date, shard=shard, rows=rows, frauds=frauds, sha256=file_sha256(path))


def _manifest(shards: list[ShardInfo]) -> DatasetManifest:
    schema = {"numeric": ["x"]}
    return DatasetManifest(
        dataset="fraud-train", version="v1", created_at="2026-03-10T00:00:00Z", schema_version=1,
        feature_version=1, numeric_features=("x",), categorical_features={}, label_cutoff="2026-03-10T00:00:00Z",
        splits={"train": DateWindow("2026-03-01", "2026-03-01"), "test": DateWindow("2026-03-02", "2026-03-02")},
        num_shards_per_date=2, shards=tuple(shards), kafka_offsets={"transactions": {"0": [0, 5]}},
        content_hash=content_hash(shards, schema),
    )


def test_publish_then_read_by_split_and_window(tmp_path):
    shards = [_write_shard(tmp_path, "2026-03-01", 0, 3, 1), _write_shard(tmp_path, "2026-03-01", 1, 2, 0),
              _write_shard(tmp_path, "2026-03-02", 0, 4, 2)]
    publish_manifest(tmp_path, _manifest(shards))
    manifest = load_manifest(tmp_path)
    assert manifest.version == "v1" and manifest.kafka_offsets == {"transactions": {"0": [0, 5]}}
    assert len(read_split(tmp_path, manifest, "train")) == 5
    assert read_split(tmp_path, manifest, "test")["label"].sum() == 2
    assert len(read_window(tmp_path, manifest, "2026-03-01", "2026-03-02")) == 9
    with pytest.raises(ManifestError, match="no rows"):
        read_window(tmp_path, manifest, "2026-04-01", "2026-04-02")
    with pytest.raises(ManifestError, match="no split 'validation'"):
        manifest.shards_for("validation")


def test_content_hash_changes_with_data_and_not_with_order(tmp_path):
    a = _write_shard(tmp_path, "2026-03-01", 0, 3, 1)
    b = _write_shard(tmp_path, "2026-03-02", 0, 4, 2)
    assert content_hash([a, b], {"s": 1}) == content_hash([b, a], {"s": 1})
    assert content_hash([a, b], {"s": 1}) != content_hash([a, b], {"s": 2})
    changed = _write_shard(tmp_path, "2026-03-02", 0, 4, 1)
    assert content_hash([a, changed], {"s": 1}) != content_hash([a, b], {"s": 1})


def test_refuses_to_publish_missing_or_altered_shards(tmp_path):
    shard = _write_shard(tmp_path, "2026-03-01", 0, 3, 1)
    (tmp_path / shard.path).write_bytes(b"truncated")
    with pytest.raises(ManifestError, match="does not match its hash"):
        publish_manifest(tmp_path, _manifest([shard]))
    (tmp_path / shard.path).unlink()
    with pytest.raises(ManifestError, match="is missing"):
        publish_manifest(tmp_path, _manifest([shard]))
    # Nothing looks published after the refusals.
    with pytest.raises(ManifestError, match="no published dataset"):
        load_manifest(tmp_path)


def test_corrupt_manifest_and_row_count_mismatch_are_errors(tmp_path):
    shard = _write_shard(tmp_path, "2026-03-01", 0, 3, 1)
    publish_manifest(tmp_path, _manifest([shard]))
    lying = _manifest([ShardInfo(**{**shard.__dict__, "rows": 99})])
    with pytest.raises(ManifestError, match="manifest says 99"):
        read_split(tmp_path, lying, "train")
    manifest_path(tmp_path, "v1").write_text(json.dumps({"format": 1}))
    with pytest.raises(ManifestError, match="corrupt"):
        load_manifest(tmp_path)
