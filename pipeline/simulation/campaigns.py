"""Merchant campaigns of fraud rings: which merchants a ring works through on a calendar day.

A ring keeps the same merchants for ``campaign_days`` (a skimmer stays on a terminal for weeks; a
resale ring keeps buying at the same web shops) and then moves on to others. The merchants of a
period are the ``count`` candidates with the smallest hash of (merchant, period, seed): a function
of the calendar, not of the simulated window, so nightly windows agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.simulation.blocks import hash_uniform

SKIMMING, THRESHOLD = 1, 2  # campaign kinds: each draws its own merchants


@dataclass(frozen=True)
class Campaign:
    """``count`` of ``candidates`` (merchant indexes) active at a time, changing every ``period_days``."""

    seed: int
    kind: int
    candidates: np.ndarray
    count: int
    period_days: int

    def merchants_on(self, day_ordinals: np.ndarray) -> np.ndarray:
        """``(len(day_ordinals), count)``: the campaign's merchants on each calendar day."""
        period = np.asarray(day_ordinals) // self.period_days
        periods, inverse = np.unique(period, return_inverse=True)
        chosen = np.stack([self._merchants_of_period(int(p)) for p in periods])
        return chosen[inverse]

    def active(self, merchant: np.ndarray, day_ordinal: np.ndarray) -> np.ndarray:
        """Whether each ``merchant`` is in the campaign on the matching calendar day."""
        period = np.asarray(day_ordinal) // self.period_days
        out = np.zeros(len(period), bool)
        for p in np.unique(period):
            rows = period == p
            out[rows] = np.isin(np.asarray(merchant)[rows], self._merchants_of_period(int(p)))
        return out

    def _merchants_of_period(self, period: int) -> np.ndarray:
        salt = np.uint64(self.seed % 2**32) << np.uint64(8) | np.uint64(self.kind)
        u = hash_uniform(self.candidates, np.full(len(self.candidates), period), salt)
        return self.candidates[np.sort(np.argsort(u, kind="stable")[: self.count])]
