"""The dataset layout: its spelling is a contract with every dataset already on disk, so it is
written out literally here; and a producer's published files lie where the layout says."""

from __future__ import annotations

from pipeline.datasets.layout import (
    data_dir,
    latest_path,
    manifest_path,
    shard_path,
    shard_relpath,
    version_dir,
    version_relpath,
)
from pipeline.datasets.manifest import load_manifest
from pipeline.training.synthetic import SyntheticSpec, write_synthetic_dataset

SPEC = SyntheticSpec(train_days=2, validation_days=1, test_days=1, rows_per_day=40, shards_per_date=2,
                     row_group_rows=20, num_cards=50, seed=3)


def test_the_layout_is_spelled_as_published_datasets_have_it(tmp_path):
    assert shard_relpath("2026-01-05", 3) == "date=2026-01-05/shard-00003.parquet"
    assert shard_path("v1", "2026-01-05", 3) == "data/v1/date=2026-01-05/shard-00003.parquet"
    assert version_relpath("v1", "date=2026-01-05/shard-00000.parquet") == "data/v1/date=2026-01-05/shard-00000.parquet"
    assert data_dir(tmp_path) == tmp_path / "data" and version_dir(tmp_path, "v1") == tmp_path / "data" / "v1"
    assert manifest_path(tmp_path, "v1") == tmp_path / "manifests" / "v1.json"
    assert latest_path(tmp_path) == tmp_path / "LATEST"


def test_a_published_dataset_lies_where_the_layout_says(tmp_path):
    manifest = write_synthetic_dataset(tmp_path, SPEC)
    assert latest_path(tmp_path).read_text().strip() == manifest.version
    assert load_manifest(tmp_path) == manifest
    assert [s.path for s in manifest.shards] == [shard_path(manifest.version, s.date, s.shard) for s in manifest.shards]
    assert len(manifest.shards) == 4 * SPEC.shards_per_date
    on_disk = version_dir(tmp_path, manifest.version).rglob("*.parquet")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in on_disk) == sorted(s.path for s in manifest.shards)
    assert [p.name for p in data_dir(tmp_path).iterdir()] == [manifest.version]  # no staging directory left
