"""Which dates a dataset covers, how they split, which labels count, and what each split must
hold to be published: pure arithmetic.

A build is fixed by its label cutoff ``C`` (labels reported before the end of day ``C`` count) and
its last date ``E = C - label_maturity_days``: every transaction up to ``E`` has had the full
maturity period, so "no fraud report" means genuine and no immature row enters the dataset.
The days ``[S, E]`` split into consecutive windows of the configured lengths: train, then
validation, then (``gap_days`` > 0) a gap no split uses, then test (latest). With a gap, train and
validation labels are those known at the end of the gap, test labels those known at ``C`` (the
evaluation protocol of :mod:`pipeline.evaluation.protocol`: the holdout is scored as a model trained before
the test days would score it). The gap's rows are published too, as split ``gap``: the evaluator
reads which cards were reported compromised during it.

* nightly run for day ``D``: ``C = D``;
* backfill ``[D1, D2]``: ``C = D2 + maturity``; the range must be exactly the configured window and
  the raw store must already hold day ``C``. Anything else is refused (:class:`PlanError`), never
  quietly reshaped into a layout the config did not ask for.

A built dataset is published only if every split reaches ``dataset.min_rows`` and
``dataset.min_frauds`` (:func:`check_split_sizes`, else :class:`DatasetTooSmall`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from pipeline.datasets.manifest import DateWindow, ShardInfo
from pipeline.features.definitions import LOOKBACK_DAYS
from pipeline.features.params import FeatureParams
from pipeline.ingest.config import DatasetConfig

SPLITS = ("train", "validation", "test")


class PlanError(ValueError):
    """The requested dates cannot produce a dataset; the message says what to change."""


class DatasetTooSmall(ValueError):
    """A built dataset has a split below the configured minimum rows or frauds; it was not published."""


@dataclass(frozen=True)
class DatasetPlan:
    label_cutoff: date
    splits: dict[str, DateWindow]  # train, validation, test and, with a gap, "gap"

    @property
    def train_label_cutoff(self) -> date:
        """Train and validation labels are those reported by the end of this day."""
        return date.fromisoformat(self.splits["gap"].end) if "gap" in self.splits else self.label_cutoff

    def label_cutoff_time_of(self, split: str) -> datetime:
        """Reports made before this instant count for the rows of ``split``."""
        day = self.train_label_cutoff if split in ("train", "validation") else self.label_cutoff
        return datetime.combine(day + timedelta(days=1), time(0), tzinfo=UTC)

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
    """``[first, last]`` cut into train / validation / gap / test; test, gap and validation get their
    configured day counts (latest days), train gets the rest (at least one day)."""
    test_start = last - timedelta(days=config.test_days - 1)
    gap_start = test_start - timedelta(days=config.gap_days)
    validation_start = gap_start - timedelta(days=config.validation_days)
    if validation_start <= first:
        raise PlanError(f"{first}..{last} is too short: validation ({config.validation_days} days) and test "
                        f"({config.test_days} days) leave no training day; widen the range")
    iso = date.isoformat
    windows = {
        "train": DateWindow(iso(first), iso(validation_start - timedelta(days=1))),
        "validation": DateWindow(iso(validation_start), iso(gap_start - timedelta(days=1))),
        "test": DateWindow(iso(test_start), iso(last)),
    }
    if config.gap_days:
        windows["gap"] = DateWindow(iso(gap_start), iso(test_start - timedelta(days=1)))
    return windows


def plan_nightly(run_date: date, config: DatasetConfig) -> DatasetPlan:
    last = run_date - timedelta(days=config.label_maturity_days)
    first = last - timedelta(days=config.window_days - 1)
    return DatasetPlan(run_date, split_windows(first, last, config))


def window_terms(config: DatasetConfig) -> str:
    """The day counts that add up to ``config.window_days``, in layout order, as the operator sets
    them in ingest.toml (a zero gap lays out nothing and is left out)."""
    terms = [("train_days", config.train_days), ("validation_days", config.validation_days),
             ("gap_days", config.gap_days), ("test_days", config.test_days)]
    return " + ".join(f"{name} {days}" for name, days in terms if days or name != "gap_days")


def plan_backfill(start: date, end: date, config: DatasetConfig, data_until: date | None) -> DatasetPlan:
    """The dataset whose rows span exactly ``[start, end]``, labels as of ``end + maturity``.

    ``data_until``: the latest date the raw store holds (None when it is empty). Raises
    :class:`PlanError` when the range is not the configured window or its labels are not mature
    in the raw store yet; the message says what the store holds and what the request needs.
    """
    if end < start:
        raise PlanError(f"--end {end} is before --start {start}")
    days = (end - start).days + 1
    if days != config.window_days:
        first = end - timedelta(days=config.window_days - 1)
        raise PlanError(
            f"--start {start} --end {end} spans {days} days, but [dataset] in ingest.toml lays out "
            f"{config.window_days} ({window_terms(config)}): use --start {first} --end {end}, "
            f"or change those day counts")
    if data_until is None:
        raise PlanError("the raw store is empty: ingest from Kafka first (nightly run, or backfill --from-kafka)")
    plan = plan_nightly(end + timedelta(days=config.label_maturity_days), config)
    if data_until < plan.label_cutoff:
        latest_end = data_until - timedelta(days=config.label_maturity_days)
        raise PlanError(
            f"labels for --end {end} mature on {plan.label_cutoff} (label_maturity_days "
            f"{config.label_maturity_days}), but the raw store's transactions end on {data_until}: ingest up to "
            f"{plan.label_cutoff} first (nightly run, or --from-kafka), or end the range on or before {latest_end} "
            f"(--start {latest_end - timedelta(days=config.window_days - 1)} --end {latest_end})")
    return plan


@dataclass(frozen=True)
class SplitCount:
    rows: int
    frauds: int


def split_counts(splits: dict[str, DateWindow], shards: list[ShardInfo] | tuple[ShardInfo, ...]) -> dict[str, SplitCount]:
    """Rows and frauds per split: a shard counts for the split whose window holds its date."""
    return {name: SplitCount(sum(s.rows for s in shards if window.contains(s.date)),
                             sum(s.frauds for s in shards if window.contains(s.date)))
            for name, window in splits.items()}


def check_split_sizes(plan: DatasetPlan, counts: dict[str, SplitCount], config: DatasetConfig,
                      data_until: date | None) -> None:
    """Raise :class:`DatasetTooSmall` naming every split below ``min_rows`` / ``min_frauds``.

    ``data_until`` (the raw store's latest transaction date) goes into the message: a window past
    the data is the usual cause.
    """
    short = []
    for name in SPLITS:
        window, count = plan.splits[name], counts.get(name, SplitCount(0, 0))
        if count.rows < config.min_rows.of(name) or count.frauds < config.min_frauds.of(name):
            short.append(f"{name} {window.start}..{window.end} has {count.rows} rows and {count.frauds} frauds "
                         f"(needs {config.min_rows.of(name)} and {config.min_frauds.of(name)})")
    _refuse(plan, short, data_until)


def check_raw_rows(plan: DatasetPlan, raw_rows_by_date: dict[date, int], config: DatasetConfig,
                   data_until: date | None) -> None:
    """Refuse the build before any feature is computed when it could only be too small.

    A split's rows are among the raw store's transactions on its dates (one row per transaction),
    so when those are already fewer than the split's ``min_rows``, :func:`check_split_sizes` would
    refuse the built dataset anyway: a night planned past the data fails in seconds, not after the
    whole feature build. Same error and remedy.
    """
    short = []
    for name in SPLITS:
        window = plan.splits[name]
        raw = sum(n for day, n in raw_rows_by_date.items() if window.contains(day.isoformat()))
        if raw < config.min_rows.of(name):
            short.append(f"{name} {window.start}..{window.end} has {raw} rows at most (the raw transactions "
                         f"on its dates; needs {config.min_rows.of(name)})")
    _refuse(plan, short, data_until)


def _refuse(plan: DatasetPlan, short: list[str], data_until: date | None) -> None:
    if not short:
        return
    held = f"The raw store's transactions end on {data_until}" if data_until else "The raw store is empty"
    raise DatasetTooSmall(
        f"dataset for label cutoff {plan.label_cutoff} not published, too small: {'; '.join(short)}. "
        f"{held}. Pick a run date (or range) whose windows hold that much data, or lower "
        f"dataset.min_rows / dataset.min_frauds in ingest.toml; LATEST is unchanged")
