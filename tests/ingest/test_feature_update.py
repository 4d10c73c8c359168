"""The incremental feature table against a full Spark rebuild: nights with late payments and
back-dated fraud reports give the same rows, values and dataset content hash; a night killed while
writing leaves no half-written partition."""

from __future__ import annotations

import dataclasses
import os
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.datasets import feature_table as feature_table_module
from pipeline.datasets.feature_table import FINGERPRINT_FILE, FeatureTable
from pipeline.datasets.manifest import content_hash, load_manifest
from pipeline.ingest.config import SplitMinimums, load_ingest_config
from pipeline.ingest.dataset_builder import (
    build_dataset,
    dataset_rows,
    schema_description,
    spark_window_features,
)
from pipeline.ingest.dataset_plan import plan_nightly
from pipeline.ingest.feature_update import blocks, feature_table_root, plan_dates, update_feature_table
from pipeline.ingest.raw_commit import commit_raw_run
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.shards import write_empty_shards, write_shards
from tests.ingest.kafka_helpers import small_simulation

FIRST_NIGHT = date(2026, 2, 10)  # window 2026-02-01..02-08 (8 days, maturity 2), lookback from 01-02
LATE_DAY = date(2026, 2, 7)  # payments of this day arrive one night late
BACKDATED = pd.Timestamp("2026-02-03T12:00:00Z")  # a report made then, delivered on the third night


@pytest.fixture(scope="module")
def sim():
    return small_simulation(days=44, num_cards=150)


def config():
    base = load_ingest_config("dev")
    dataset = dataclasses.replace(base.dataset, train_days=4, validation_days=2, gap_days=0, test_days=2,
                                  label_maturity_days=2, num_shards_per_date=2,
                                  min_rows=SplitMinimums(1, 1, 1), min_frauds=SplitMinimums(0, 0, 0))
    return dataclasses.replace(base, dataset=dataset)


def late_ids(sim) -> set[str]:
    tx = sim.transactions
    return set(tx[pd.to_datetime(tx["event_time"]).dt.date == LATE_DAY]["transaction_id"].iloc[::7])


def backdated_reports(sim) -> pd.DataFrame:
    """Fraud reports made on 02-03 at noon (before dates already computed) for payments of that morning
    that had none, plus an earlier report for a payment already reported: each moves a merchant's
    fraud rate from 02-04 noon on."""
    tx, labels = sim.transactions, sim.labels
    when = pd.to_datetime(tx["event_time"])
    unreported = tx[(when >= "2026-02-03") & (when < BACKDATED)
                    & ~tx["transaction_id"].isin(labels["transaction_id"])]
    reported = labels[labels["is_fraud"] & (pd.to_datetime(labels["reported_at"]) > "2026-02-05")]
    ids = list(unreported["transaction_id"].iloc[:3]) + list(reported["transaction_id"].iloc[:1])
    return pd.DataFrame({"schema_version": 1, "transaction_id": ids, "is_fraud": True,
                         "reported_at": BACKDATED.strftime("%Y-%m-%dT%H:%M:%S.000Z"), "source": "chargeback"})


def deliver(store: RawStore, sim, night: int, delivered: set[str]) -> None:
    """Commit what the raw store holds by night ``night``'s run date: payments and reports made by
    its end, minus the late payments on night 0 and the back-dated reports before night 2."""
    run_date = FIRST_NIGHT + timedelta(days=night)
    end = pd.Timestamp(run_date + timedelta(days=1), tz="UTC")
    tx, labels = sim.transactions, sim.labels
    due_tx = tx[(pd.to_datetime(tx["event_time"]) < end) & ~tx["transaction_id"].isin(delivered)]
    if night == 0:
        due_tx = due_tx[~due_tx["transaction_id"].isin(late_ids(sim))]
    due_labels = labels[(pd.to_datetime(labels["reported_at"]) < end)
                        & (pd.to_datetime(labels["reported_at"]) >= end - pd.Timedelta(days=1) if night else True)]
    if night == 2:
        due_labels = pd.concat([due_labels, backdated_reports(sim)], ignore_index=True)
    delivered |= set(due_tx["transaction_id"])
    with store.locked():
        commit_raw_run(store, f"night-{night}", due_tx, due_labels)


def spark_rebuild_hash(spark, store, plan, cfg, out: Path) -> tuple[str, list]:
    """Content hash and shards of the dataset the Spark build over the whole window writes."""
    rows = dataset_rows(spark, store, plan, cfg.features, spark_window_features(spark, store, plan, cfg.features))
    shards = write_shards(rows, out, cfg.dataset.num_shards_per_date)
    shards += write_empty_shards(out, [d.isoformat() for d in plan_dates(plan)], cfg.dataset.num_shards_per_date, shards)
    return content_hash(shards, schema_description(plan, cfg.dataset, cfg.features)), shards


def shard_frame(root: Path, paths: list[str]) -> pd.DataFrame:
    return pd.concat(pq.read_table(root / p).to_pandas() for p in paths).set_index("transaction_id").sort_index()


def assert_same_rows(mine: pd.DataFrame, reference: pd.DataFrame) -> None:
    assert list(mine.index) == list(reference.index)
    for column in reference.columns:
        if pd.api.types.is_numeric_dtype(reference[column]):
            np.testing.assert_allclose(mine[column], reference[column], rtol=0, atol=1e-9, err_msg=column)
        else:
            assert mine[column].equals(reference[column]), column


@pytest.mark.spark
def test_incremental_nights_equal_a_full_spark_rebuild(spark, state_dir, sim, tmp_path):
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    expected_computed = [
        [f"2026-02-0{d}" for d in range(1, 9)],  # cold: the whole window
        ["2026-02-07", "2026-02-08", "2026-02-09"],  # late payments of 02-07 reach 02-07.., plus the new 02-09
        [f"2026-02-{d:02d}" for d in range(4, 11)],  # usable from 02-04 12:00: 02-04.., plus the new 02-10
    ]
    for night, computed in enumerate(expected_computed):
        deliver(store, sim, night, delivered)
        plan = plan_nightly(FIRST_NIGHT + timedelta(days=night), cfg.dataset)
        with store.locked():
            built = build_dataset(spark, store, plan, cfg.dataset, cfg.features, f"build-{night}")
        assert built.features["computed"] == computed, night
        reference_hash, reference = spark_rebuild_hash(spark, store, plan, cfg, tmp_path / f"spark-{night}")
        manifest = load_manifest(cfg.dataset.dataset_root(), built.version)
        mine = shard_frame(cfg.dataset.dataset_root(), [s.path for s in manifest.shards])
        assert_same_rows(mine, shard_frame(tmp_path / f"spark-{night}", [s.path for s in reference]))
        assert built.content_hash == reference_hash, night
    newly_reported = backdated_reports(sim)["transaction_id"].iloc[:3]
    assert mine.loc[newly_reported, "label"].tolist() == [1, 1, 1]  # the last night's labels saw them too


def test_two_stores_named_alike_get_their_own_tables_and_a_moved_store_keeps_its_own(state_dir, tmp_path, caplog):
    first, second = RawStore(tmp_path / "a" / "raw"), RawStore(tmp_path / "b" / "raw")
    table = feature_table_root("", first)
    assert table != feature_table_root("", second)  # different stores, different locks: never one table
    assert table.parent == state_dir / "features" and table.name.startswith("raw-")
    (tmp_path / "c").mkdir()
    os.rename(first.root, tmp_path / "c" / "raw")
    assert feature_table_root("", RawStore(tmp_path / "c" / "raw")) == table
    assert feature_table_root("/elsewhere/features", first) == Path("/elsewhere/features")  # configured: as is

    legacy = state_dir / "features" / "raw"  # keyed by the name alone, before the store's id
    (legacy / "date=2026-02-01").mkdir(parents=True)
    feature_table_root("", second)
    assert f"{legacy} is a feature table of the old layout" in caplog.text and legacy.is_dir()


def test_blocks_cut_runs_of_consecutive_dates():
    days = [date(2026, 1, d) for d in (1, 2, 3, 4, 5, 9, 10)]
    assert blocks(days, 3) == [days[0:3], days[3:5], days[5:7]]
    assert blocks([], 3) == []


def _nights_0_and_1(state_dir: Path, sim) -> tuple[RawStore, FeatureTable, object, object]:
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    deliver(store, sim, 0, delivered)
    with store.locked():
        update_feature_table(store, table, plan_nightly(FIRST_NIGHT, cfg.dataset), cfg.features, 28)
    deliver(store, sim, 1, delivered)
    return store, table, plan_nightly(FIRST_NIGHT + timedelta(days=1), cfg.dataset), cfg


def _crash_writing(path, *args, **kwargs):
    Path(path).write_bytes(b"PAR1 half a file")
    raise KeyboardInterrupt("killed while writing")


def _crash_between_renames(staging, final, **kwargs):
    if Path(final).exists():
        os.replace(final, Path(final).with_name(f".old-{Path(final).name}"))
    raise KeyboardInterrupt("killed between the renames")


@pytest.mark.parametrize("crash", ["writing", "between_renames"])
def test_a_killed_night_leaves_no_half_written_partition(state_dir, sim, monkeypatch, crash):
    store, table, plan, cfg = _nights_0_and_1(state_dir, sim)
    before = {d: table.fingerprint(d) for d in plan_dates(plan) + [plan.first_date - timedelta(days=1)]}
    if crash == "writing":
        monkeypatch.setattr(feature_table_module, "write_partition_file", _crash_writing)
    else:
        monkeypatch.setattr(feature_table_module, "publish_dir", _crash_between_renames)
    with store.locked(), pytest.raises(KeyboardInterrupt):
        update_feature_table(store, table, plan, cfg.features, 28)
    monkeypatch.undo()
    for directory in table.root.glob("date=*"):  # every visible partition is whole and unchanged
        day = date.fromisoformat(directory.name.split("=", 1)[1])
        assert sorted(p.name for p in directory.iterdir()) == sorted([FINGERPRINT_FILE, "features.parquet"])
        assert table.fingerprint(day) == before[day]
        pq.read_table(table.partition_file(day))
    crashed = date(2026, 2, 7)  # the first date the late payments changed
    assert table.fingerprint(crashed) == (before[crashed] if crash == "writing" else None)

    with store.locked():
        again = update_feature_table(store, table, plan, cfg.features, 28)
    assert again.computed == ("2026-02-07", "2026-02-08", "2026-02-09")
    assert not [p for p in table.root.iterdir() if p.name.startswith(".")]
    fresh = FeatureTable(state_dir / "fresh")
    with store.locked():
        update_feature_table(store, fresh, plan, cfg.features, 3)  # blocks of 3 days: same rows
    days = plan_dates(plan)
    assert table.read(days).sort_by("transaction_id").equals(fresh.read(days).sort_by("transaction_id"))
