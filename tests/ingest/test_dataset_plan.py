"""Dataset dates: nightly windows end at the last mature date; backfills respect the data's end."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime

import pytest

from pipeline.datasets.manifest import DateWindow
from pipeline.features.transforms import FeatureParams
from pipeline.ingest.config import DatasetConfig
from pipeline.ingest.dataset_plan import PlanError, plan_backfill, plan_nightly

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
    assert plan.splits["test"] == DateWindow("2026-01-18", "2026-01-20")


def test_backfill_shrinks_to_mature_dates_when_the_data_ends_early():
    plan = plan_backfill(date(2026, 1, 1), date(2026, 1, 20), CFG, data_until=date(2026, 1, 24))
    assert plan.label_cutoff == date(2026, 1, 24)
    assert plan.last_date == date(2026, 1, 17)


@pytest.mark.parametrize("start,end,until,message", [
    (date(2026, 1, 10), date(2026, 1, 1), date(2026, 2, 1), "before --start"),
    (date(2026, 1, 1), date(2026, 1, 20), None, "raw store is empty"),
    (date(2026, 1, 20), date(2026, 1, 25), date(2026, 1, 22), "no date .* is mature"),
    (date(2026, 1, 1), date(2026, 1, 6), date(2026, 3, 1), "too short"),
])
def test_impossible_backfills_say_what_to_change(start, end, until, message):
    with pytest.raises(PlanError, match=message):
        plan_backfill(start, end, CFG, until)


def test_nightly_with_too_few_window_days_is_refused():
    with pytest.raises(PlanError, match="too short"):
        plan_nightly(date(2026, 1, 28), dataclasses.replace(CFG, train_days=0))
