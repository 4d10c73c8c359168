"""The live prior tracker: the bench's nightly schedule run online, from histograms, with the
source prior standing until enough scores are seen."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ConfigError
from pipeline.decisions.prior_shift import estimate_prior, prior_corrected_scores
from pipeline.decisions.prior_tracking import (
    DAY_US,
    MAX_CACHED_PRIORS,
    LivePriorTracker,
    PriorTrackingConfig,
    utc_day,
)
from tests.decisions.test_prior_shift import _calibrated_sample

SOURCE = 0.04
DAY0 = 20_500  # days since the epoch (2026-02-16)


def _weeks(rng: np.random.Generator, rates: list[float], per_day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    days, labels, scores = [], [], []
    for i, rate in enumerate(rates):
        y, p = _calibrated_sample(rng, per_day, rate, source_prior=SOURCE)
        days.append(np.full(per_day, DAY0 + i)), labels.append(y), scores.append(p)
    return np.concatenate(days), np.concatenate(labels), np.concatenate(scores)


def test_online_estimates_match_the_replayed_schedule_from_exact_scores() -> None:
    rng = np.random.default_rng(11)
    rates = [0.04] * 3 + [0.08] * 4 + [0.02] * 4  # the fraud rate moves twice
    days, _, scores = _weeks(rng, rates, 4000)
    tracker = LivePriorTracker(SOURCE, PriorTrackingConfig(lookback_days=3, min_scores=1))
    served = np.empty_like(scores)
    for day in np.unique(days):  # a day is scored (at the prior of the days before it), then counted
        rows = days == day
        served[rows] = [tracker.probability(s, int(day)) for s in scores[rows]]
        tracker.observe(days[rows], scores[rows])
    replayed = prior_corrected_scores(days.astype("datetime64[D]"), scores, SOURCE, 3)
    # Histogram bins of ~0.024 log-odds move the estimate a little, never the ranking.
    np.testing.assert_allclose(served, replayed, atol=2e-3)
    assert tracker.prior(DAY0 + 11) == pytest.approx(estimate_prior(scores[days >= DAY0 + 8], SOURCE), rel=5e-3)
    assert tracker.prior(DAY0 + 11) < 0.03 and tracker.prior(DAY0 + 7) > 0.06  # it followed both moves


def test_the_source_prior_stands_until_the_lookback_holds_min_scores() -> None:
    rng = np.random.default_rng(2)
    _, high = _calibrated_sample(rng, 5000, 0.12, source_prior=SOURCE)
    tracker = LivePriorTracker(SOURCE, PriorTrackingConfig(lookback_days=2, min_scores=6000))
    tracker.observe(np.full(5000, DAY0), high)
    assert tracker.prior(DAY0 + 1) == SOURCE and tracker.probability(0.3, DAY0 + 1) == 0.3
    assert not tracker.describe()["correcting"]
    tracker.observe(np.full(2000, DAY0), high[:2000])  # a late batch of the same day: 7000 behind DAY0 + 1 now
    assert tracker.prior(DAY0 + 1) > 0.08
    assert tracker.probability(0.3, DAY0 + 1) > 0.3
    assert tracker.describe()["day"] == DAY0 and tracker.prior(DAY0) == SOURCE  # nothing before DAY0


def test_memory_is_the_lookback_not_the_traffic() -> None:
    tracker = LivePriorTracker(SOURCE, PriorTrackingConfig(lookback_days=7, min_scores=1))
    for day in range(DAY0, DAY0 + 60):
        tracker.observe(np.full(100, day), np.full(100, 0.05))
    assert sorted(tracker._days) == list(range(DAY0 + 52, DAY0 + 60))
    tracker.observe(np.array([DAY0]), np.array([0.5]))  # far too late to matter: dropped at once
    assert DAY0 not in tracker._days


def test_utc_day_and_config_errors() -> None:
    assert utc_day(DAY0 * DAY_US) == DAY0 and utc_day(DAY0 * DAY_US - 1) == DAY0 - 1
    with pytest.raises(ConfigError, match="lookback_days"):
        PriorTrackingConfig(lookback_days=0)
    with pytest.raises(ConfigError, match="mode"):
        PriorTrackingConfig(mode="nightly")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="source_prior"):
        LivePriorTracker(0.0, PriorTrackingConfig())


def test_one_payment_dated_far_ahead_does_not_push_the_real_days_out():
    # With the time rules off a payment of 9999-12-31 reaches the tracker; it must cost one day's slot,
    # not every real day's histogram.
    rng = np.random.default_rng(5)
    _, high = _calibrated_sample(rng, 3000, 0.12, source_prior=SOURCE)
    tracker = LivePriorTracker(SOURCE, PriorTrackingConfig(lookback_days=2, min_scores=1000))
    tracker.observe(np.full(3000, DAY0), high)
    tracker.observe(np.array([2_932_896]), np.array([0.5]))  # 9999-12-31
    tracker.observe(np.full(3000, DAY0 + 1), high)
    assert tracker.prior(DAY0 + 2) > 0.08  # both real days still behind it
    assert len(tracker._days) <= 3


def test_estimates_kept_stay_bounded_whatever_dates_are_asked_for():
    # Payments dated all over (clocks off, replays) each ask for their day's prior: the tracker keeps
    # at most MAX_CACHED_PRIORS estimates, the most recently asked, and recomputes a dropped one.
    rng = np.random.default_rng(6)
    _, high = _calibrated_sample(rng, 3000, 0.12, source_prior=SOURCE)
    tracker = LivePriorTracker(SOURCE, PriorTrackingConfig(lookback_days=2, min_scores=1000))
    tracker.observe(np.full(3000, DAY0), high)
    today = tracker.prior(DAY0 + 1)
    assert today > 0.08
    for day in range(DAY0 + 2, DAY0 + 2 + 10 * MAX_CACHED_PRIORS):
        tracker.prior(day)
        tracker.prior(DAY0 + 1)  # asked all along: never the one dropped
    assert len(tracker._priors) == MAX_CACHED_PRIORS
    assert DAY0 + 1 in tracker._priors and DAY0 + 2 not in tracker._priors
    assert tracker.prior(DAY0 + 2) == today  # dropped, recomputed from the same histograms
    assert tracker.probabilities([0.3, 0.3], [DAY0 + 1, 1_000_000]) == [tracker.probability(0.3, DAY0 + 1), 0.3]
