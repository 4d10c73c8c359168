"""The tracked review threshold: the validation threshold until enough live scores, then the budget's
quantile of the last ``window`` of them (the operating points' own rule), within its bounds."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ConfigError
from pipeline.decisions.operating_points import threshold_for_rate
from pipeline.decisions.review_tracking import ReviewThresholdTracker, ReviewTrackingConfig

RATE = 0.05


def tracker(validation: float = 0.5, block: float = 0.99, **config) -> ReviewThresholdTracker:
    settings = {"window": 400, "min_scores": 100, "refresh_every": 1, "max_factor": 1e6} | config
    return ReviewThresholdTracker(RATE, validation, block, ReviewTrackingConfig(**settings))


def quantile_of(scores: np.ndarray) -> float:
    return threshold_for_rate(np.sort(scores)[::-1], RATE)


def test_the_validation_threshold_decides_until_min_scores_are_seen():
    t = tracker(validation=0.5, min_scores=100)
    t.observe(np.full(99, 0.01))
    assert t.threshold == 0.5 and t.describe()["tracking"] is False
    t.observe(np.full(1, 0.01))
    assert t.threshold == pytest.approx(0.01) and t.describe()["tracking"] is True


def test_the_threshold_is_the_budgets_quantile_of_the_last_window_across_ring_wraps():
    rng = np.random.default_rng(3)
    t = tracker(window=400)
    seen = np.empty(0)
    for size in (37, 250, 401, 3, 129, 800, 61):  # batches smaller and larger than the window
        batch = rng.beta(0.5, 8.0, size)
        t.observe(batch)
        seen = np.concatenate([seen, batch])
        assert t.threshold == (quantile_of(seen[-400:]) if seen.size >= 100 else 0.5)


def test_it_refreshes_only_every_refresh_every_scores():
    t = tracker(window=200, min_scores=100, refresh_every=50)
    t.observe(np.linspace(0.0, 1.0, 100))  # 100 seen: min_scores met and 100 >= 50 since the start
    first = t.threshold
    t.observe(np.ones(49))  # not yet 50 new scores: unchanged
    assert t.threshold == first
    t.observe(np.ones(1))
    assert t.threshold > first


def test_flagging_at_the_tracked_threshold_holds_the_budget_on_a_drifted_stream():
    rng = np.random.default_rng(7)
    live = rng.beta(0.5, 8.0, 60_000) * 3.0 / (1 + 2.0 * rng.beta(0.5, 8.0, 60_000))  # scores unlike validation's
    validation_threshold = 0.3  # chosen on validation: flags far more than the budget here
    t = tracker(validation=validation_threshold, window=5_000, min_scores=1_000, refresh_every=100)
    flagged = 0
    for start in range(0, live.size, 64):
        batch = live[start:start + 64]
        flagged += int(np.count_nonzero(batch >= t.threshold))
        t.observe(batch)
    assert np.mean(live >= validation_threshold) > 2 * RATE
    assert flagged / live.size == pytest.approx(RATE, rel=0.2)


def test_the_threshold_stays_within_its_bounds_and_below_the_block_threshold():
    collapsed = tracker(validation=0.2, max_factor=4.0)
    collapsed.observe(np.zeros(500))  # a broken feature: every score 0
    assert collapsed.threshold == pytest.approx(0.05) and collapsed.describe()["at_bound"] is True
    inflated = tracker(validation=0.2, block=0.6, max_factor=4.0)
    inflated.observe(np.full(500, 0.95))
    assert inflated.threshold == 0.6  # validation x 4 = 0.8, but never above the block threshold
    assert inflated.bounds == (0.05, 0.6)


def test_non_finite_scores_are_not_counted():
    t = tracker(min_scores=100)
    t.observe(np.array([np.nan] * 200 + [0.1] * 99))
    assert t.describe()["scores_seen"] == 99 and t.threshold == 0.5


@pytest.mark.parametrize("settings, key", [
    ({"mode": "median"}, "mode"),
    ({"window": 10, "min_scores": 20}, "min_scores"),
    ({"min_scores": 0}, "min_scores"),
    ({"refresh_every": 0}, "refresh_every"),
    ({"max_factor": 0.5}, "max_factor"),
])
def test_bad_settings_name_their_key(settings, key):
    with pytest.raises(ConfigError, match=f"review_tracking.*{key}|{key}"):
        ReviewTrackingConfig(**settings)


def test_a_primed_tracker_holds_the_budget_of_the_recent_traffic_from_its_first_decision():
    rng = np.random.default_rng(11)
    recent = rng.beta(0.5, 8.0, 300)
    t = tracker(validation=0.5, window=400, min_scores=100, refresh_every=350)
    t.prime(recent)
    assert t.threshold == quantile_of(recent) and t.primed == 300  # no live score, no wait for refresh_every
    described = t.describe()
    assert described["tracking"] and described["primed_scores"] == 300 and described["scores_seen"] == 0
    live = rng.beta(0.5, 8.0, 350)
    t.observe(live)  # live scores join the same window
    assert t.threshold == quantile_of(np.concatenate([recent, live])[-400:])


def test_too_little_recent_traffic_leaves_the_validation_threshold_until_live_scores_make_up_the_rest():
    t = tracker(validation=0.5, window=400, min_scores=100, refresh_every=10)
    t.prime(np.full(60, 0.02))
    assert t.threshold == 0.5 and not t.describe()["tracking"]
    t.observe(np.full(40, 0.02))  # 60 primed + 40 live = min_scores
    assert t.threshold == pytest.approx(0.02)
