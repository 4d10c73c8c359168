"""Dataset dates: nightly windows end at the last mature date; backfills are the configured window or
refused; a dataset with a split below its minimums is refused with counts and dates."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, timedelta

import pytest

from pipeline.datasets.layout import shard_relpath
from pipeline.datasets.manifest import DateWindow, ShardInfo
from pipeline.features.params import FeatureParams
from pipeline.ingest.config import DatasetConfig, SplitMinimums
from pipeline.ingest.dataset_plan import (
    DatasetTooSmall,
    PlanError,
    SplitCount,
    check_raw_rows,
    check_split_sizes,
    plan_backfill,
    plan_nightly,
    split_counts,
)

CFG = DatasetConfig(label_maturity_days=7, train_days=14, validation_days=3, test_days=3)


def test_nightly_window_ends_maturity_days_before_the_run_date():
    plan = plan_nightly(date(2026, 1, 28), CFG)
    assert plan.label_cutoff == date(2026, 1, 28)
    assert plan.splits == {"train": DateWindow("2026-01-02", "2026-01-15"),
                           "validation": DateWindow("2026-01-16", "2026-01-18"),
                           "test": DateWindow("2026-01-19", "2026-01-21")}
    assert plan.label_cutoff_time == datetime(2026, 1, 29, tzinfo=UTC)


def test_history_reaches_back_for_windows_and_label_matching():
    plan = plan_nightly(date(2026, 1, 28), CFG)
    params = FeatureParams(label_delay_hours=36, label_match_days=90)
    assert plan.feature_history_start() == date(2025, 12, 3)  # 30 days before the first row
    assert plan.label_history_start(params) == date(2025, 11, 30)  # minus ceil(1.5 days) + 1
    assert plan.label_match_start(params) == date(2025, 9, 1)


def test_backfill_uses_its_range_and_a_cutoff_maturity_days_later():
    plan = plan_backfill(date(2026, 1, 1), date(2026, 1, 20), CFG, data_until=date(2026, 2, 10))
    assert plan.label_cutoff == date(2026, 1, 27)
    assert (plan.first_date, plan.last_date) == (date(2026, 1, 1), date(2026, 1, 20))
    assert plan.splits == {"train": DateWindow("2026-01-01", "2026-01-14"),
                           "validation": DateWindow("2026-01-15", "2026-01-17"),
                           "test": DateWindow("2026-01-18", "2026-01-20")}


def test_backfill_is_refused_when_the_raw_store_ends_before_its_labels_mature():
    # The cutoff used to move back to the store's last date, silently shortening the range.
    with pytest.raises(PlanError) as refused:
        plan_backfill(date(2026, 1, 1), date(2026, 1, 20), CFG, data_until=date(2026, 1, 24))
    message = str(refused.value)
    assert "mature on 2026-01-27" in message and "transactions end on 2026-01-24" in message
    assert "--start 2025-12-29 --end 2026-01-17" in message  # the latest range the store can serve
    assert plan_backfill(date(2025, 12, 29), date(2026, 1, 17), CFG, date(2026, 1, 24)).label_cutoff == date(2026, 1, 24)


@pytest.mark.parametrize("start,end,message", [
    (date(2026, 1, 5), date(2026, 1, 20), r"spans 16 days, .* lays out 20 \(train_days 14 \+ validation_days 3 "
                                          r"\+ test_days 3\): use --start 2026-01-01 --end 2026-01-20"),
    (date(2025, 12, 1), date(2026, 1, 20), "spans 51 days"),
])
def test_backfill_of_another_length_than_the_configured_window_is_refused(start, end, message):
    # Train used to absorb the difference, ignoring train_days.
    with pytest.raises(PlanError, match=message):
        plan_backfill(start, end, CFG, data_until=date(2026, 3, 1))


@pytest.mark.parametrize("start,end,until,message", [
    (date(2026, 1, 10), date(2026, 1, 1), date(2026, 2, 1), "before --start"),
    (date(2026, 1, 1), date(2026, 1, 20), None, "raw store is empty"),
])
def test_impossible_backfills_say_what_to_change(start, end, until, message):
    with pytest.raises(PlanError, match=message):
        plan_backfill(start, end, CFG, until)


def test_nightly_with_too_few_window_days_is_refused():
    with pytest.raises(PlanError, match="too short"):
        plan_nightly(date(2026, 1, 28), dataclasses.replace(CFG, train_days=0))


def _shard(day: str, rows: int, frauds: int, index: int = 0) -> ShardInfo:
    return ShardInfo(shard_relpath(day, index), day, index, rows, frauds, "0" * 64)


def test_split_counts_add_the_shards_inside_each_window():
    plan = plan_nightly(date(2026, 1, 28), CFG)
    shards = [_shard("2026-01-02", 10, 1), _shard("2026-01-15", 5, 0, 1), _shard("2026-01-16", 7, 2),
              _shard("2026-01-21", 3, 1), _shard("2026-01-22", 100, 50)]  # the last is outside every window
    assert split_counts(plan.splits, shards) == {"train": SplitCount(15, 1), "validation": SplitCount(7, 2),
                                                 "test": SplitCount(3, 1)}


MINIMUMS = dataclasses.replace(CFG, min_rows=SplitMinimums(train=100, validation=20, test=20),
                               min_frauds=SplitMinimums(train=5, validation=1, test=0))


def test_splits_at_their_minimums_pass():
    plan = plan_nightly(date(2026, 1, 28), MINIMUMS)
    check_split_sizes(plan, {"train": SplitCount(100, 5), "validation": SplitCount(20, 1), "test": SplitCount(20, 0)},
                      MINIMUMS, date(2026, 1, 28))


def test_every_split_below_its_minimum_is_named_with_its_dates_and_counts():
    plan = plan_nightly(date(2026, 1, 28), MINIMUMS)
    counts = {"train": SplitCount(100, 4), "validation": SplitCount(20, 1), "test": SplitCount(19, 3)}
    with pytest.raises(DatasetTooSmall) as refused:
        check_split_sizes(plan, counts, MINIMUMS, date(2026, 1, 28))
    message = str(refused.value)
    assert "train 2026-01-02..2026-01-15 has 100 rows and 4 frauds (needs 100 and 5)" in message
    assert "test 2026-01-19..2026-01-21 has 19 rows and 3 frauds (needs 20 and 0)" in message
    assert "validation" not in message and "LATEST is unchanged" in message


def test_a_window_past_the_data_is_refused_with_where_the_data_ends():
    plan = plan_nightly(date(2026, 3, 30), CFG)  # default minimums: no empty split, a fraud in train
    with pytest.raises(DatasetTooSmall, match="train 2026-03-04..2026-03-17 has 0 rows .*transactions end on 2026-01-30"):
        check_split_sizes(plan, split_counts(plan.splits, []), CFG, date(2026, 1, 30))


def test_a_gap_separates_test_from_training_and_moves_the_training_label_cutoff():
    config = dataclasses.replace(CFG, gap_days=7)  # 14 train + 3 validation + 7 gap + 3 test
    plan = plan_nightly(date(2026, 2, 10), config)
    assert {k: (w.start, w.end) for k, w in plan.splits.items()} == {
        "train": ("2026-01-08", "2026-01-21"), "validation": ("2026-01-22", "2026-01-24"),
        "gap": ("2026-01-25", "2026-01-31"), "test": ("2026-02-01", "2026-02-03")}  # test ends run date - 7
    # Test rows mature by the run date; training rows by the gap's end, 7 days after their last day.
    assert plan.label_cutoff == date(2026, 2, 10) and plan.train_label_cutoff == date(2026, 1, 31)
    assert plan.label_cutoff_time_of("validation").isoformat() == "2026-02-01T00:00:00+00:00"
    assert plan.label_cutoff_time_of("test").isoformat() == "2026-02-11T00:00:00+00:00"
    assert plan_nightly(date(2026, 2, 10), CFG).train_label_cutoff == date(2026, 2, 10)  # no gap: one cutoff


def test_raw_rows_below_a_minimum_refuse_the_build_before_features():
    plan = plan_nightly(date(2026, 1, 28), MINIMUMS)  # train 01-02..01-15, validation 01-16..01-18
    days = lambda start, n, rows: {date(2026, 1, start) + timedelta(days=i): rows for i in range(n)}  # noqa: E731
    enough = days(2, 14, 10) | days(16, 3, 10) | days(19, 3, 10)  # 140, 30, 30 raw rows
    check_raw_rows(plan, enough, MINIMUMS, date(2026, 1, 21))
    short = enough | days(16, 3, 6) | {date(2026, 1, 1): 1000, date(2026, 1, 22): 1000}  # outside every split
    with pytest.raises(DatasetTooSmall) as refused:
        check_raw_rows(plan, short, MINIMUMS, date(2026, 1, 22))
    message = str(refused.value)
    assert "validation 2026-01-16..2026-01-18 has 18 rows at most (the raw transactions on its dates; needs 20)" in message
    assert "train" not in message.split("too small:")[1] and "test 2026" not in message
    assert "transactions end on 2026-01-22" in message and "LATEST is unchanged" in message
