"""The recent-traffic ring: the latest rows in arrival order, whatever the batch sizes."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.serving.recent_traffic import RecentTraffic


def rows(start: int, n: int) -> list[dict[str, float]]:
    return [{"a": float(i), "b": float(-i)} for i in range(start, start + n)]


def test_it_keeps_the_latest_capacity_rows_oldest_first_across_wraps():
    ring = RecentTraffic(5, columns=("a", "b"))
    assert len(ring) == 0 and ring.matrix().shape == (0, 2)
    added = 0
    for n in (2, 4, 1, 7, 3):  # wraps several times, one batch larger than the ring
        ring.add(rows(added, n))
        added += n
        expected = np.arange(max(0, added - 5), added, dtype=float)
        assert np.array_equal(ring.matrix()[:, 0], expected) and np.array_equal(ring.matrix()[:, 1], -expected)
    assert len(ring) == 5 and ring.added == added


def test_a_row_missing_a_feature_is_refused_and_an_empty_ring_is_refused():
    ring = RecentTraffic(3, columns=("a", "b"))
    with pytest.raises(KeyError):
        ring.add([{"a": 1.0}])
    with pytest.raises(ValueError, match="at least one"):
        RecentTraffic(0)


# -- where a version's review threshold starts: its scores on the latest payments the service saw ---------

from dataclasses import replace  # noqa: E402
from datetime import timedelta  # noqa: E402

import pandas as pd  # noqa: E402

from pipeline.decisions.operating_points import threshold_for_rate  # noqa: E402
from pipeline.decisions.review_tracking import ReviewTrackingConfig  # noqa: E402
from pipeline.features import definitions as fd  # noqa: E402
from pipeline.registry.aliases import advance_champion  # noqa: E402
from pipeline.registry.config import RegistryConfig  # noqa: E402
from pipeline.serving.config import ScoresConfig, StreamConfig  # noqa: E402
from pipeline.serving.features import FeatureStore  # noqa: E402
from pipeline.serving.seed import seed_from_raw_store  # noqa: E402
from tests.monitoring.raw_store import write_raw_store  # noqa: E402
from tests.serving import factory  # noqa: E402
from tests.serving.conftest import SHIPPED_BUDGET, event  # noqa: E402
from tests.serving.test_service import make_champion, quick, started  # noqa: E402

MARGIN_HOURS = 24.0


def _history(window: factory.Window, tmp_path, days: int):
    """The window's first ``days`` days committed to a raw store; the rest, the traffic to score."""
    times = pd.to_datetime(window.transactions["event_time"], utc=True)
    cut = times.min().normalize() + timedelta(days=days)
    reports = [(t, bool(f), r) for t, f, r in zip(window.labels["transaction_id"], window.labels["is_fraud"],
                                                  pd.to_datetime(window.labels["reported_at"], utc=True), strict=True)
               if r < cut]
    write_raw_store(tmp_path / "raw", window.transactions[times < cut], reports)
    latest = times[times < cut].max()
    recent_ids = set(window.transactions.loc[(times < cut) & (times >= latest - timedelta(hours=MARGIN_HOURS)),
                                             "transaction_id"])
    return tmp_path / "raw", recent_ids, [event(r) for r in window.transactions[times >= cut].to_dict("records")]


def _sorted_rows(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.lexsort(matrix.T[::-1])]


@pytest.mark.parametrize("margin_hours", [MARGIN_HOURS, 168.0])
def test_the_seed_keeps_the_features_training_builds_for_the_latest_days_payments(window, tmp_path, margin_hours):
    """The latest day's payments, whatever the expiry margin beyond a day (a week's, for late payments)."""
    raw, recent_ids, _ = _history(window, tmp_path, days=7)
    store = FeatureStore(factory.PARAMS, margin_hours, recent=RecentTraffic(10_000))
    report = seed_from_raw_store(store, raw)
    offline = window.features[window.features["transaction_id"].isin(recent_ids)]
    assert report.recent == len(store.recent) == len(recent_ids) > 100
    expected = _sorted_rows(offline[list(fd.FEATURE_COLUMNS)].to_numpy(dtype=np.float64))
    assert np.allclose(_sorted_rows(store.recent.matrix()), expected, rtol=1e-9, atol=1e-9)


def test_a_version_starts_at_the_budget_of_the_latest_traffic_on_a_restart_and_on_a_hot_swap(
        serving_config, make_service, config, client, shipped, models, window, kafka_config, tmp_path):
    raw, recent_ids, next_days = _history(window, tmp_path, days=7)
    # The good model shipped with thresholds chosen for far higher scores: at them it flags almost nothing.
    drifted = factory.log_model(RegistryConfig(model_name="fd-serving-primed"), models.good, shipped.shifted_points)
    old = make_champion(config, client, drifted, shipped.shifted_points)
    tracking = ReviewTrackingConfig(window=5000, min_scores=300, refresh_every=100, max_factor=1000.0)
    serving = replace(quick(serving_config, review_tracking=tracking), scores=ScoresConfig(publish=False),
                      stream=StreamConfig(seed_from_raw_store=True, consume=False, expiry_margin_hours=MARGIN_HOURS))
    service = make_service(serving, kafka=kafka_config, raw_root=raw)
    recent_rows = window.features[window.features["transaction_id"].isin(recent_ids)]
    with started(service):
        assert service.wait_seeded(120)
        tracked = service.health()["model"]["review_tracking"]
        # Primed before any request, at the budget's quantile of the version's own scores on those payments.
        assert tracked["primed_scores"] == len(recent_ids) and tracked["tracking"] and tracked["scores_seen"] == 0
        oracle = threshold_for_rate(np.sort(factory.scores_of(models.good, recent_rows))[::-1],
                                    SHIPPED_BUDGET.review_rate)
        assert tracked["review_threshold"] == pytest.approx(oracle, rel=1e-4)
        first = service.score_batch(next_days[:300])
        flagged = np.mean([r.decision.value != "allow" for r in first])
        # The hot swap: the new version starts from its own scores on the same latest traffic, and the
        # payments just scored.
        new = factory.register(config, shipped.shifted, shipped.shifted_points)
        advance_champion(client, config.model_name, new, old)
        service.parts.champion.sync()
        swapped = service.health()["model"]["review_tracking"]
    assert flagged == pytest.approx(SHIPPED_BUDGET.review_rate, abs=0.05)
    assert np.mean(np.asarray(factory.scores_of(models.good, recent_rows)) >= shipped.shifted_points.review_threshold) < \
        SHIPPED_BUDGET.review_rate / 2  # the validation threshold alone would flag under half the budget
    assert service.live_model().version == new and swapped["primed_scores"] == len(recent_ids) + 300
