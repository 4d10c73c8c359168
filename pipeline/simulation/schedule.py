"""How many fraud incidents of each pattern a window gets, and on which days: the fraud mix drifts,
and so may the fraud rate.

Fraud makes up ``fraud_rate`` of each day's payments, scaled per calendar week (Monday to Sunday) by
``exp(drift.fraud_rate_amplitude * u)`` with ``u`` uniform in [-1, 1], drawn from the seed and the
week alone (:func:`daily_fraud_rate`; amplitude 0, the default, keeps the rate flat). How that fraud
splits between patterns changes over weeks: each pattern's share in ``pattern_mix`` is scaled by
``exp(amplitude * sin(2 pi week / period + phase))``, with a period of 3-10 weeks and a phase
drawn per pattern from the seed alone. Both are functions of the calendar day, so consecutive
windows (nightly runs) continue them, and a test week has a different mix (and rate) from the weeks
before it.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.blocks import hash_uniform
from pipeline.simulation.config import PATTERNS, SimulationConfig

_DRIFT_STREAM = 0xD21F7  # distinct from the population's and the windows' streams
_RATE_STREAM = 0x2A7E5  # salt of the weekly fraud-rate levels
MIN_PERIOD_WEEKS, MAX_PERIOD_WEEKS = 3.0, 10.0
# Patterns whose waves were drawn before later ones were added; a later pattern draws its wave after
# theirs, so adding a pattern never moves the others' waves.
FIRST_PATTERNS = 6


def daily_fraud_rate(config: SimulationConfig, day_ordinals: np.ndarray) -> np.ndarray:
    """Each calendar day's fraud share of payments: ``fraud_rate`` times its week's level."""
    ordinals = np.asarray(day_ordinals, np.int64)
    amplitude = config.drift.fraud_rate_amplitude
    if amplitude == 0:
        return np.full(len(ordinals), config.fraud_rate)
    week = (ordinals - 1) // 7  # ordinal 1 (0001-01-01) is a Monday
    u = hash_uniform(week, np.full(len(week), config.seed), _RATE_STREAM)
    return config.fraud_rate * np.exp(amplitude * (2.0 * u - 1.0))


def daily_mix(config: SimulationConfig, day_ordinals: np.ndarray) -> np.ndarray:
    """``(days, len(PATTERNS))``: each day's share of fraud transactions per pattern (rows sum to 1)."""
    rng = np.random.default_rng([config.seed, _DRIFT_STREAM])
    period = rng.uniform(MIN_PERIOD_WEEKS, MAX_PERIOD_WEEKS, FIRST_PATTERNS)
    phase = rng.uniform(0.0, 2 * np.pi, FIRST_PATTERNS)
    later = len(PATTERNS) - FIRST_PATTERNS
    period = np.concatenate([period, rng.uniform(MIN_PERIOD_WEEKS, MAX_PERIOD_WEEKS, later)])
    phase = np.concatenate([phase, rng.uniform(0.0, 2 * np.pi, later)])
    weeks = np.asarray(day_ordinals, np.float64)[:, None] / 7.0
    wave = np.sin(2 * np.pi * weeks / period[None, :] + phase[None, :])
    base = np.array([config.pattern_mix.weights()[name] for name in PATTERNS])
    weights = base[None, :] * np.exp(config.drift.fraud_mix_amplitude * wave)
    return weights / weights.sum(axis=1, keepdims=True)


def incident_days(rng: np.random.Generator, config: SimulationConfig, genuine_per_day: np.ndarray,
                  first_day_ordinal: int, mean_events: dict[str, float]) -> dict[str, np.ndarray]:
    """For each pattern, the window day (0-based) on which each of its incidents starts.

    Sized so that fraud makes up each day's :func:`daily_fraud_rate` of its payments: incidents =
    fraud payments wanted / the pattern's mean payments per incident. Every pattern with a positive weight gets at least
    one incident, so small runs show them all.
    """
    days = len(genuine_per_day)
    ordinals = first_day_ordinal + np.arange(days)
    mix = daily_mix(config, ordinals)
    rate = daily_fraud_rate(config, ordinals)
    fraud_tx = rate / (1.0 - rate) * np.asarray(genuine_per_day, np.float64)
    out: dict[str, np.ndarray] = {}
    for p, name in enumerate(PATTERNS):
        expected = fraud_tx * mix[:, p] / mean_events[name]
        total = expected.sum()
        if config.pattern_mix.weights()[name] <= 0 or total <= 0:
            out[name] = np.zeros(0, np.int64)
            continue
        n = max(1, round(total))
        out[name] = np.sort(rng.choice(days, size=n, p=expected / total))
    return out
