"""Which dates a dataset covers, how they split, and which labels count: pure date arithmetic.

A build is fixed by its label cutoff ``C`` (labels reported before the end of day ``C`` count) and
its last date ``E = C - label_maturity_days``: every transaction up to ``E`` has had the full
maturity period, so "no fraud report" means genuine and no immature row enters the dataset.
The days ``[S, E]`` split into consecutive windows: train, then validation, then test (latest).

* nightly run for day ``D``: ``C = D``; the window holds the configured train/validation/test days;
* backfill ``[D1, D2]``: rows from ``D1`` to ``D2``; ``C = D2 + maturity`` unless the raw store's
  data ends earlier (then ``C`` is that last date and ``E`` shrinks accordingly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from pipeline.datasets.manifest import DateWindow
from pipeline.features.definitions import LOOKBACK_DAYS
from pipeline.features.transforms import FeatureParams
from pipeline.ingest.config import DatasetConfig

SPLITS = ("train", "validation", "test")


class PlanError(ValueError):
    """The requested dates cannot produce a dataset; the message says what to change."""


@dataclass(frozen=True)
class DatasetPlan:
    label_cutoff: date
    splits: dict[str, DateWindow]

    @property
    def first_date(self) -> date:
        return date.fromisoformat(self.splits["train"].start)

    @property
    def last_date(self) -> date:
        return date.fromisoformat(self.splits["test"].end)

    @property
    def label_cutoff_time(self) -> datetime:
        """Reports made before this instant count (end of the cutoff day, UTC)."""
        return datetime.combine(self.label_cutoff + timedelta(days=1), time(0), tzinfo=UTC)

    def feature_history_start(self) -> date:
        """First raw transaction date the card and merchant windows need."""
        return self.first_date - timedelta(days=LOOKBACK_DAYS)

    def label_history_start(self, params: FeatureParams) -> date:
        """First report date that can feed a merchant fraud rate inside the dataset."""
        return self.feature_history_start() - timedelta(days=math.ceil(params.label_delay_hours / 24) + 1)

    def label_match_start(self, params: FeatureParams) -> date:
        """First transaction date a counted fraud report may refer to."""
        return self.label_history_start(params) - timedelta(days=params.label_match_days)


def split_windows(first: date, last: date, config: DatasetConfig) -> dict[str, DateWindow]:
    """``[first, last]`` cut into train / validation / test; test and validation get their configured
    day counts (latest days), train gets the rest (at least one day)."""
    test_start = last - timedelta(days=config.test_days - 1)
    validation_start = test_start - timedelta(days=config.validation_days)
    if validation_start <= first:
        raise PlanError(f"{first}..{last} is too short: validation ({config.validation_days} days) and test "
                        f"({config.test_days} days) leave no training day; widen the range")
    iso = date.isoformat
    return {
        "train": DateWindow(iso(first), iso(validation_start - timedelta(days=1))),
        "validation": DateWindow(iso(validation_start), iso(test_start - timedelta(days=1))),
        "test": DateWindow(iso(test_start), iso(last)),
    }


def plan_nightly(run_date: date, config: DatasetConfig) -> DatasetPlan:
    last = run_date - timedelta(days=config.label_maturity_days)
    first = last - timedelta(days=config.window_days - 1)
    return DatasetPlan(run_date, split_windows(first, last, config))


def plan_backfill(start: date, end: date, config: DatasetConfig, data_until: date | None) -> DatasetPlan:
    """``data_until``: the latest date the raw store holds (None when it is empty)."""
    if end < start:
        raise PlanError(f"--end {end} is before --start {start}")
    if data_until is None:
        raise PlanError("the raw store is empty: ingest from Kafka first (nightly run, or backfill --from-kafka)")
    cutoff = min(end + timedelta(days=config.label_maturity_days), data_until)
    last = min(end, cutoff - timedelta(days=config.label_maturity_days))
    if last < start:
        raise PlanError(f"no date in {start}..{end} is mature: the raw store ends {data_until} and labels need "
                        f"{config.label_maturity_days} days to mature; pick an earlier range")
    return DatasetPlan(cutoff, split_windows(start, last, config))
