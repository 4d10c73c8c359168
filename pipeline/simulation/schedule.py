"""How many fraud incidents of each pattern a window gets, and on which days: the fraud mix drifts.

Fraud makes up ``fraud_rate`` of each day's payments. How that fraud splits between patterns
changes over weeks: each pattern's share in ``pattern_mix`` is scaled by
``exp(amplitude * sin(2 pi week / period + phase))``, with a period of 3-10 weeks and a phase
drawn per pattern from the seed alone. The wave is a function of the calendar day, so consecutive
windows (nightly runs) continue it, and a test week has a different mix from the weeks before it.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.config import PATTERNS, SimulationConfig

_DRIFT_STREAM = 0xD21F7  # distinct from the population's and the windows' streams
MIN_PERIOD_WEEKS, MAX_PERIOD_WEEKS = 3.0, 10.0


def daily_mix(config: SimulationConfig, day_ordinals: np.ndarray) -> np.ndarray:
    """``(days, len(PATTERNS))``: each day's share of fraud transactions per pattern (rows sum to 1)."""
    rng = np.random.default_rng([config.seed, _DRIFT_STREAM])
    period = rng.uniform(MIN_PERIOD_WEEKS, MAX_PERIOD_WEEKS, len(PATTERNS))
    phase = rng.uniform(0.0, 2 * np.pi, len(PATTERNS))
    weeks = np.asarray(day_ordinals, np.float64)[:, None] / 7.0
    wave = np.sin(2 * np.pi * weeks / period[None, :] + phase[None, :])
    base = np.array([config.pattern_mix.weights()[name] for name in PATTERNS])
    weights = base[None, :] * np.exp(config.drift.fraud_mix_amplitude * wave)
    return weights / weights.sum(axis=1, keepdims=True)


def incident_days(rng: np.random.Generator, config: SimulationConfig, genuine_per_day: np.ndarray,
                  first_day_ordinal: int, mean_events: dict[str, float]) -> dict[str, np.ndarray]:
    """For each pattern, the window day (0-based) on which each of its incidents starts.

    Sized so that fraud makes up ``fraud_rate`` of all payments: incidents = fraud payments wanted
    / the pattern's mean payments per incident. Every pattern with a positive weight gets at least
    one incident, so small runs show them all.
    """
    days = len(genuine_per_day)
    mix = daily_mix(config, first_day_ordinal + np.arange(days))
    fraud_tx = config.fraud_rate / (1.0 - config.fraud_rate) * np.asarray(genuine_per_day, np.float64)
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
