"""Nights through the lookback cache against builds without it: late payments on a cached date and
back-dated fraud reports give the same rows as a table built from the raw store alone; a night reads
only its new fraud reports and looks up only their payments; a night after a night merges its new
date into the sorted history it carried (no lookback date read) and one with a late payment on a
carried date reads the dates instead; a night killed while writing the cache publishes nothing half
written."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract import Kind
from pipeline.datasets import lookback_cache as lookback_cache_module
from pipeline.datasets.feature_table import FINGERPRINT_FILE, PARTITION_FILE, FeatureTable
from pipeline.datasets.lookback_cache import LookbackCache
from pipeline.ingest import block_payments as block_payments_module
from pipeline.ingest import feature_inputs as feature_inputs_module
from pipeline.ingest.dataset_plan import plan_nightly
from pipeline.ingest.feature_inputs import raw_files_keys
from pipeline.ingest.feature_update import feature_table_root, plan_dates, update_feature_table
from pipeline.ingest.raw_commit import commit_raw_run
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_reader import committed_files_by_date
from tests.ingest.kafka_helpers import small_simulation
from tests.ingest.test_feature_update import FIRST_NIGHT, config, deliver

LOOKBACK_ONLY_DAY = date(2026, 1, 31)  # before every window below: only ever read as lookback


@pytest.fixture(scope="module")
def sim():
    return small_simulation(days=44, num_cards=150)


def build_without_cache(store: RawStore, plan, cfg, root: Path) -> pa.Table:
    """The plan's rows computed from the raw store alone (a new table: no cache, no partitions)."""
    table = FeatureTable(root)
    with store.locked():
        update_feature_table(store, table, plan, cfg.features, cfg.dataset.feature_block_days)
    return table.read(plan_dates(plan)).sort_by("transaction_id")


def night(store: RawStore, table: FeatureTable, plan, cfg) -> tuple[str, ...]:
    with store.locked():
        return update_feature_table(store, table, plan, cfg.features, cfg.dataset.feature_block_days).computed


def test_nights_through_the_cache_equal_builds_without_it(state_dir, sim, tmp_path):
    """Nights 0-2 of the feature-update story: late payments of 02-07, back-dated fraud reports."""
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    for n in range(3):
        deliver(store, sim, n, delivered)
        plan = plan_nightly(FIRST_NIGHT + timedelta(days=n), cfg.dataset)
        assert night(store, table, plan, cfg), n
        cached = table.read(plan_dates(plan)).sort_by("transaction_id")
        assert cached.equals(build_without_cache(store, plan, cfg, tmp_path / f"fresh-{n}")), n
    oldest = min(p.name for p in table.lookback_cache().root.glob("date=*"))
    assert oldest == f"date={plan.feature_history_start().isoformat()}.arrow"  # older dates were let go


def commit_holding_back_late_payments(store: RawStore, sim) -> pd.Series:
    """Commit night 0's payments but a quarter of 01-31's (only ever lookback); return those (a mask)."""
    tx = sim.transactions
    when = pd.to_datetime(tx["event_time"])
    held_back = (when.dt.date == LOOKBACK_ONLY_DAY) & (tx.index % 4 == 0)
    with store.locked():
        commit_raw_run(store, "night-0", tx[(when < pd.Timestamp(FIRST_NIGHT + timedelta(days=1), tz="UTC"))
                                           & ~held_back], sim.labels.iloc[:0])
    return held_back


def test_late_payments_on_a_cached_date_invalidate_it(state_dir, sim, tmp_path):
    cfg, store = config(), RawStore(state_dir / "raw")
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    tx, when = sim.transactions, pd.to_datetime(sim.transactions["event_time"])
    held_back = commit_holding_back_late_payments(store, sim)
    first, second = plan_nightly(FIRST_NIGHT, cfg.dataset), plan_nightly(FIRST_NIGHT + timedelta(days=1), cfg.dataset)
    night(store, table, first, cfg)
    cache, vocabulary = table.lookback_cache(), table.lookback_cache().read_vocabulary()
    old_key = raw_files_keys(store, committed_files_by_date(store, Kind.TRANSACTION))[LOOKBACK_ONLY_DAY]
    assert cache.read_date(LOOKBACK_ONLY_DAY, old_key, vocabulary) is not None

    new_day = (when >= pd.Timestamp(FIRST_NIGHT + timedelta(days=1), tz="UTC")) & (
        when < pd.Timestamp(FIRST_NIGHT + timedelta(days=2), tz="UTC"))
    with store.locked():  # the held-back payments of 01-31 arrive a night late, with the new day's
        commit_raw_run(store, "night-1", tx[held_back | new_day], sim.labels.iloc[:0])
    assert night(store, table, second, cfg) == tuple(d.isoformat() for d in plan_dates(second))
    files = committed_files_by_date(store, Kind.TRANSACTION)
    assert len(files[LOOKBACK_ONLY_DAY]) == 2  # the late file: a new key, so the entry was a miss and rewritten
    assert cache.read_date(LOOKBACK_ONLY_DAY, old_key, vocabulary) is None
    new_key = raw_files_keys(store, files)[LOOKBACK_ONLY_DAY]
    rewritten = cache.read_date(LOOKBACK_ONLY_DAY, new_key, cache.read_vocabulary())
    assert rewritten.num_rows == int((when.dt.date == LOOKBACK_ONLY_DAY).sum())
    cached = table.read(plan_dates(second)).sort_by("transaction_id")
    assert cached.equals(build_without_cache(store, second, cfg, tmp_path / "fresh"))


def _killed(sink, schema, **kwargs):
    raise KeyboardInterrupt("killed while writing the cache")


def test_a_night_killed_while_caching_publishes_nothing_half_written(state_dir, sim, tmp_path, monkeypatch):
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    deliver(store, sim, 0, delivered)
    first, second = plan_nightly(FIRST_NIGHT, cfg.dataset), plan_nightly(FIRST_NIGHT + timedelta(days=1), cfg.dataset)
    night(store, table, first, cfg)
    before = {d: table.fingerprint(d) for d in plan_dates(second)}
    deliver(store, sim, 1, delivered)
    monkeypatch.setattr(lookback_cache_module.pa.ipc, "new_file", _killed)
    with pytest.raises(KeyboardInterrupt):
        night(store, table, second, cfg)
    monkeypatch.undo()
    assert {d: table.fingerprint(d) for d in plan_dates(second)} == before  # nothing published
    for directory in table.root.glob("date=*"):
        assert sorted(p.name for p in directory.iterdir()) == sorted([FINGERPRINT_FILE, PARTITION_FILE])
    assert not [p for p in table.lookback_cache().root.iterdir() if p.name.startswith(".")]

    assert night(store, table, second, cfg) == ("2026-02-07", "2026-02-08", "2026-02-09")
    cached = table.read(plan_dates(second)).sort_by("transaction_id")
    assert cached.equals(build_without_cache(store, second, cfg, tmp_path / "fresh"))


def test_a_night_reads_only_its_new_fraud_reports_and_matches_only_those(state_dir, sim, tmp_path, monkeypatch):
    cfg, store, delivered = config(), RawStore(state_dir / "raw"), set()
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    for n in range(2):
        deliver(store, sim, n, delivered)
        night(store, table, plan_nightly(FIRST_NIGHT + timedelta(days=n), cfg.dataset), cfg)
    deliver(store, sim, 2, delivered)  # with back-dated reports: their payments are looked up
    label_reads, searched = [], []
    read_files, dated_payments = feature_inputs_module.read_files, block_payments_module._dated_payments

    def recording_read(files, kind, columns):
        label_reads.extend(files if kind == Kind.LABEL else [])
        return read_files(files, kind, columns)

    def recording_search(cache, files, block, keys):
        searched.extend(keys)
        return dated_payments(cache, files, block, keys)

    monkeypatch.setattr(feature_inputs_module, "read_files", recording_read)
    monkeypatch.setattr(block_payments_module, "_dated_payments", recording_search)
    third = plan_nightly(FIRST_NIGHT + timedelta(days=2), cfg.dataset)
    assert night(store, table, third, cfg)
    label_files = committed_files_by_date(store, Kind.LABEL)
    new_label_files = [p for paths in label_files.values() for p in paths if "run_id=night-2" in str(p)]
    touched = {d for d, paths in label_files.items() if set(paths) & set(new_label_files)}  # read again, whole
    assert touched and sorted(label_reads) == sorted(p for d in touched for p in label_files[d])
    new_reports = pd.read_parquet(new_label_files)
    new_frauds = set(new_reports[new_reports["is_fraud"]]["transaction_id"])
    tx = sim.transactions
    their_dates = set(pd.to_datetime(tx[tx["transaction_id"].isin(new_frauds)]["event_time"]).dt.date)
    assert searched and set(searched) <= their_dates  # older reports' payments come from the stored matches
    cached = table.read(plan_dates(third)).sort_by("transaction_id")
    assert cached.equals(build_without_cache(store, third, cfg, tmp_path / "fresh"))


def deliver_on_time(store: RawStore, sim, night: int) -> None:
    """Night ``night``'s run commits what was made during its run date (night 0: everything by then)."""
    end = pd.Timestamp(FIRST_NIGHT + timedelta(days=night + 1), tz="UTC")
    start = end - pd.Timedelta(days=1) if night else pd.Timestamp.min.tz_localize("UTC")
    tx, labels = sim.transactions, sim.labels
    tx_when, reported = pd.to_datetime(tx["event_time"]), pd.to_datetime(labels["reported_at"])
    with store.locked():
        commit_raw_run(store, f"on-time-{night}", tx[(tx_when >= start) & (tx_when < end)],
                       labels[(reported >= start) & (reported < end)])


def test_nights_merge_their_dates_into_the_history_they_carry_and_read_no_older_lookback_date(
        state_dir, sim, tmp_path, monkeypatch):
    cfg, store = config(), RawStore(state_dir / "raw")
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    cache = table.lookback_cache()
    deliver_on_time(store, sim, 0)
    night(store, table, plan_nightly(FIRST_NIGHT, cfg.dataset), cfg)  # stores the history of 01-10..02-08
    dates_read, served = [], []
    read_date, read_history = LookbackCache.read_date, LookbackCache.read_history

    def recording_date(self, day, key, vocabulary):
        dates_read.append(day)
        return read_date(self, day, key, vocabulary)

    def recording_history(self, start, keys, vocabulary):
        served.append(read_history(self, start, keys, vocabulary))
        return served[-1]

    monkeypatch.setattr(LookbackCache, "read_date", recording_date)
    monkeypatch.setattr(LookbackCache, "read_history", recording_history)
    monkeypatch.setattr(block_payments_module, "REBASE_DAYS", 2)
    for n, beyond in ((1, []), (2, [date(2026, 2, 9)])):  # night 2 merges 02-09 from its date file, then stores
        deliver_on_time(store, sim, n)
        plan = plan_nightly(FIRST_NIGHT + timedelta(days=n), cfg.dataset)
        dates_read.clear()
        assert night(store, table, plan, cfg) == (plan.last_date.isoformat(),)
        assert served[-1] is not None and served[-1][1] == beyond, n  # the carried history served the lookback
        assert [d for d in dates_read if d < plan.last_date] == beyond, n  # no other lookback date was loaded
    monkeypatch.undo()
    assert table.read(plan_dates(plan)).sort_by("transaction_id").equals(
        build_without_cache(store, plan, cfg, tmp_path / "fresh"))
    files = committed_files_by_date(store, Kind.TRANSACTION)
    keys = raw_files_keys(store, files)
    start = plan.last_date - timedelta(days=29)
    stored = cache.read_history(start, {d: k for d, k in keys.items() if start <= d <= plan.last_date},
                                cache.read_vocabulary())
    assert stored is not None and stored[1] == []  # night 2 stored the 30 dates the next night looks back on
    assert stored[0].num_rows == sum(pq.ParquetFile(p).metadata.num_rows
                                     for d in files if start <= d <= plan.last_date for p in files[d])


def test_a_late_payment_on_a_carried_date_makes_the_history_a_miss(state_dir, sim, tmp_path):
    cfg, store = config(), RawStore(state_dir / "raw")
    tx, when = sim.transactions, pd.to_datetime(sim.transactions["event_time"])
    held_back = commit_holding_back_late_payments(store, sim)
    table = FeatureTable(feature_table_root(cfg.dataset.feature_table, store))
    night(store, table, plan_nightly(FIRST_NIGHT, cfg.dataset), cfg)
    with store.locked():
        commit_raw_run(store, "late", tx[held_back], sim.labels.iloc[:0])
    new_date = plan_nightly(FIRST_NIGHT + timedelta(days=1), cfg.dataset).last_date
    files = committed_files_by_date(store, Kind.TRANSACTION)
    with store.locked():  # the block a night after night 0 would read, were 01-31 not in older dates' windows
        carried = block_payments_module.read_block_payments(store, table.lookback_cache(), files, [new_date])
        fresh = block_payments_module.read_block_payments(store, LookbackCache(tmp_path / "empty"), files, [new_date])
    assert LOOKBACK_ONLY_DAY in carried.dated  # read again: the stored history was a miss
    assert len(carried.history) == len(fresh.history) == len(
        tx[(when.dt.date >= new_date - timedelta(days=30)) & (when.dt.date <= new_date)])
    assert np.array_equal(np.sort(carried.history.by_card.ts_us), np.sort(fresh.history.by_card.ts_us))
