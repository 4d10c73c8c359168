"""The fraud mix drifts over weeks, keyed to the calendar; incident counts follow the fraud rate."""

from __future__ import annotations

import dataclasses
from datetime import date

import numpy as np
import pytest

from pipeline.simulation import PATTERNS, SimulationConfig
from pipeline.simulation.patterns import GENERATORS
from pipeline.simulation.schedule import daily_fraud_rate, daily_mix, incident_days

CONFIG = SimulationConfig(seed=5)
FIRST = date(2026, 1, 5).toordinal()
MEAN_EVENTS = {name: p.mean_events(CONFIG.fraud_shapes) for name, p in GENERATORS.items()}
WEIGHTED = [p for p in PATTERNS if CONFIG.pattern_mix.weights()[p] > 0]  # compromise_window is off by default


def test_each_day_mix_is_a_distribution_that_drifts_over_weeks() -> None:
    mix = daily_mix(CONFIG, FIRST + np.arange(84))
    assert mix.shape == (84, len(PATTERNS))
    np.testing.assert_allclose(mix.sum(axis=1), 1.0)
    weekly = mix.reshape(12, 7, -1).mean(axis=1)[:, [PATTERNS.index(p) for p in WEIGHTED]]
    # Over twelve weeks every pattern's share moves by at least half of itself.
    assert (weekly.max(axis=0) / weekly.min(axis=0) > 1.5).all()
    # ...but slowly: consecutive days hardly differ.
    assert np.abs(np.diff(mix, axis=0)).max() < 0.05


def test_mix_depends_on_the_calendar_day_not_on_the_window() -> None:
    whole = daily_mix(CONFIG, FIRST + np.arange(30))
    night = daily_mix(CONFIG, FIRST + np.arange(12, 13))
    np.testing.assert_array_equal(night, whole[12:13])
    other_seed = daily_mix(dataclasses.replace(CONFIG, seed=6), FIRST + np.arange(30))
    assert not np.allclose(other_seed, whole)


def test_without_drift_the_mix_is_the_configured_one() -> None:
    still = dataclasses.replace(CONFIG, drift=dataclasses.replace(CONFIG.drift, fraud_mix_amplitude=0.0))
    weights = np.array([CONFIG.pattern_mix.weights()[p] for p in PATTERNS])
    np.testing.assert_allclose(daily_mix(still, FIRST + np.arange(3)), np.tile(weights / weights.sum(), (3, 1)))


def test_incidents_give_the_fraud_rate_and_fall_on_busier_and_favoured_days() -> None:
    genuine_per_day = np.array([10_000, 10_000, 10_000, 40_000, 10_000, 10_000, 10_000])
    days = incident_days(np.random.default_rng(0), CONFIG, genuine_per_day, FIRST, MEAN_EVENTS)
    assert set(days) == set(PATTERNS)
    fraud_payments = sum(len(days[p]) * MEAN_EVENTS[p] for p in PATTERNS)
    wanted = CONFIG.fraud_rate / (1 - CONFIG.fraud_rate) * genuine_per_day.sum()
    assert fraud_payments == pytest.approx(wanted, rel=0.05)
    all_days = np.concatenate(list(days.values()))
    assert all_days.min() >= 0 and all_days.max() < len(genuine_per_day)
    per_day = np.bincount(all_days, minlength=7)
    assert per_day[3] > 2.5 * np.delete(per_day, 3).mean()


def test_every_pattern_with_weight_gets_an_incident_and_none_without() -> None:
    mix = dataclasses.replace(CONFIG.pattern_mix, geo_impossible=0.0)
    tiny = dataclasses.replace(CONFIG, pattern_mix=mix, fraud_rate=0.0001)
    days = incident_days(np.random.default_rng(0), tiny, np.array([500]), FIRST, MEAN_EVENTS)
    assert len(days["geo_impossible"]) == 0
    assert all(len(days[p]) >= 1 for p in WEIGHTED if p != "geo_impossible")
    assert len(days["compromise_window"]) == 0
    none = incident_days(np.random.default_rng(0), dataclasses.replace(CONFIG, fraud_rate=0.0), np.array([500]),
                         FIRST, MEAN_EVENTS)
    assert all(len(d) == 0 for d in none.values())


def test_the_fraud_rate_is_flat_by_default_and_a_weekly_level_when_it_drifts() -> None:
    np.testing.assert_array_equal(daily_fraud_rate(CONFIG, FIRST + np.arange(21)), np.full(21, CONFIG.fraud_rate))
    moving = dataclasses.replace(CONFIG, drift=dataclasses.replace(CONFIG.drift, fraud_rate_amplitude=0.4))
    rate = daily_fraud_rate(moving, FIRST + np.arange(84))  # FIRST is a Monday: twelve whole weeks
    weekly = rate.reshape(12, 7)
    assert (weekly == weekly[:, :1]).all()  # one level per Monday-to-Sunday week...
    assert len(np.unique(weekly[:, 0])) == 12  # ...a different one each week
    assert (rate >= CONFIG.fraud_rate * np.exp(-0.4)).all() and (rate <= CONFIG.fraud_rate * np.exp(0.4)).all()
    assert weekly[:, 0].max() / weekly[:, 0].min() > 1.3
    # Keyed to the calendar and the seed, not to the window.
    np.testing.assert_array_equal(daily_fraud_rate(moving, FIRST + np.arange(10, 12)), rate[10:12])
    other_seed = dataclasses.replace(moving, seed=6)
    assert not np.array_equal(daily_fraud_rate(other_seed, FIRST + np.arange(84)), rate)


def test_incidents_follow_each_weeks_fraud_rate() -> None:
    moving = dataclasses.replace(CONFIG, drift=dataclasses.replace(CONFIG.drift, fraud_rate_amplitude=0.8))
    genuine_per_day = np.full(28, 200_000)
    days = incident_days(np.random.default_rng(0), moving, genuine_per_day, FIRST, MEAN_EVENTS)
    per_day = np.zeros(28)
    for p in PATTERNS:
        np.add.at(per_day, days[p], MEAN_EVENTS[p])
    rate = daily_fraud_rate(moving, FIRST + np.arange(28))
    wanted = (rate / (1 - rate) * genuine_per_day).reshape(4, 7).sum(axis=1)
    np.testing.assert_allclose(per_day.reshape(4, 7).sum(axis=1), wanted, rtol=0.1)
