"""The live fraud prior: probabilities that stay calibrated while the fraud rate moves, in serving.

A version's scores are calibrated at its validation split's fraud rate, the *source prior* (its mean
calibrated validation score, shipped in its operating points). The tracker estimates the fraud rate
among the payments of the previous ``lookback_days`` UTC days (by the payments' event time) from the
version's own live scores, by the EM of :func:`.prior_shift.estimate_prior`, and
:meth:`LivePriorTracker.probability` moves each score from the source prior to that estimate: the
schedule the baseline bench replays (:func:`.prior_shift.prior_corrected_scores`), run online.

Decisions do not use it: they compare the model's own score with the version's operating points
(the adjustment is monotone; adjusting the score the thresholds see would move the review volume
with every estimate). What it changes is the probability analysts read, on the response and on the
scores topic.

Memory is constant in traffic: each day's scores are kept as a histogram of ``bins`` counts over
log-odds in ``[-LOGIT_RANGE, LOGIT_RANGE]`` (a bin is ~0.02 log-odds wide at 1000 bins; EM on bin
centres moves the estimate by ~1e-4 of the rate, measured in the tests), for ``lookback_days + 1``
days, and at most :data:`MAX_CACHED_PRIORS` estimates whatever dates payments carry. Until the
lookback holds ``min_scores`` payments (a version just swapped in, a restart) the source prior
stands: no correction. Pure apart from its lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pipeline.config import ConfigError
from pipeline.decisions.prior_shift import MAX_ODDS_RATIO, PRIOR_STRENGTH, estimate_prior, shift_prior

PriorMode = Literal["trailing_days", "off"]
LOGIT_RANGE = 12.0  # scores beyond sigmoid(+-12) (~6e-6 from 0 or 1) fall in the end bins
DAY_US = 86_400_000_000
# Estimates kept per tracker, least recently asked dropped first. Live traffic asks for today and a
# few days around it (payments dated late or early); a stream of far-off dates (clocks years off)
# would otherwise add one entry per distinct date for the life of the service. An estimate dropped
# is recomputed from the histograms (one EM over ``bins`` counts), so the bound costs only time.
MAX_CACHED_PRIORS = 64


@dataclass(frozen=True)
class PriorTrackingConfig:
    """``[decision.prior_tracking]`` of serving.toml."""

    # "trailing_days": serve probabilities at the fraud rate of the previous lookback_days;
    # "off": the version's calibrated scores as they are.
    mode: PriorMode = "trailing_days"
    lookback_days: int = 7  # a week evens out the weekday cycle and daily noise
    min_scores: int = 10_000  # fewer payments in the lookback: the source prior stands
    bins: int = 1000
    prior_strength: float = PRIOR_STRENGTH  # expected frauds' worth of evidence the source prior counts as
    max_odds_ratio: float = MAX_ODDS_RATIO  # the estimate's odds stay within this factor of the source's

    def __post_init__(self) -> None:
        problems = []
        if self.mode not in ("trailing_days", "off"):
            problems.append(f'decision.prior_tracking.mode must be "trailing_days" or "off", got {self.mode!r}')
        if self.lookback_days < 1:
            problems.append(f"decision.prior_tracking.lookback_days must be >= 1, got {self.lookback_days}")
        if self.min_scores < 1:
            problems.append(f"decision.prior_tracking.min_scores must be >= 1, got {self.min_scores}")
        if self.bins < 10:
            problems.append(f"decision.prior_tracking.bins must be >= 10, got {self.bins}")
        if self.prior_strength < 0 or self.max_odds_ratio < 1:
            problems.append("decision.prior_tracking needs prior_strength >= 0 and max_odds_ratio >= 1, got "
                            f"{self.prior_strength} and {self.max_odds_ratio}")
        if problems:
            raise ConfigError("; ".join(problems))


def utc_day(event_time_us: int) -> int:
    """Days since 1970-01-01 (UTC) of a time in microseconds since the epoch."""
    return event_time_us // DAY_US


class LivePriorTracker:
    """One live version's estimate of the current fraud prior, and its scores moved to it."""

    def __init__(self, source_prior: float, config: PriorTrackingConfig) -> None:
        if not 0.0 < source_prior < 1.0:
            raise ValueError(f"source_prior must be in (0, 1), got {source_prior}")
        self.source_prior = source_prior
        self.config = config
        edges = np.linspace(-LOGIT_RANGE, LOGIT_RANGE, config.bins + 1)
        self._inner_edges = edges[1:-1]
        self._centres = 1.0 / (1.0 + np.exp(-(edges[:-1] + edges[1:]) / 2))
        self._days: dict[int, np.ndarray] = {}  # UTC day -> score histogram
        # UTC day -> the estimate its payments are served at, least recently asked first
        self._priors: OrderedDict[int, float] = OrderedDict()
        self._lock = threading.Lock()  # the scoring thread and /score/batch's threads both observe

    def observe(self, days: np.ndarray, scores: np.ndarray) -> None:
        """Count a decided batch's scores under their payments' UTC days (non-finite scores skipped).
        The newest ``lookback_days + 1`` days holding scores are kept: a payment dated far ahead (the
        time rules off) takes one slot, it does not push every real day out."""
        d = np.asarray(days, dtype=np.int64).ravel()
        s = np.asarray(scores, dtype=np.float64).ravel()
        keep = np.isfinite(s)
        d, s = d[keep], s[keep]
        if s.size == 0:
            return
        logits = np.log(np.clip(s, 1e-12, 1.0)) - np.log(np.clip(1.0 - s, 1e-12, 1.0))
        bins = np.searchsorted(self._inner_edges, logits, side="right")
        slots = self.config.lookback_days + 1
        with self._lock:
            for day in map(int, np.unique(d)):
                if len(self._days) >= slots and day not in self._days and day < min(self._days):
                    continue  # older than every kept day: it counts for nothing
                hist = self._days.setdefault(day, np.zeros(self.config.bins))
                hist += np.bincount(bins[d == day], minlength=self.config.bins)
                # every later day's estimate may include this one: recompute on next use
                for later in [k for k in self._priors if k > day]:
                    del self._priors[later]
            for day in sorted(self._days)[:-slots]:
                del self._days[day]
            oldest = min(self._days, default=None)
            for day in [k for k in self._priors if oldest is None or k < oldest]:
                del self._priors[day]

    def prior(self, day: int) -> float:
        """The fraud prior the payments of UTC ``day`` are served at: EM over the scores of the
        ``lookback_days`` days before it, or the source prior with fewer than ``min_scores`` of them."""
        with self._lock:
            cached = self._priors.get(day)
            if cached is None:
                cached = self._priors[day] = self._estimate(day)
                if len(self._priors) > MAX_CACHED_PRIORS:
                    self._priors.popitem(last=False)
            else:
                self._priors.move_to_end(day)
            return cached

    def _estimate(self, day: int) -> float:
        counts = np.zeros(self.config.bins)
        for d in range(day - self.config.lookback_days, day):
            if d in self._days:
                counts += self._days[d]
        if counts.sum() < self.config.min_scores:
            return self.source_prior
        return estimate_prior(self._centres, self.source_prior, weights=counts,
                              prior_strength=self.config.prior_strength, max_odds_ratio=self.config.max_odds_ratio)

    def probabilities(self, scores: Sequence[float], days: Sequence[int]) -> list[float]:
        """Each score (calibrated at the source prior) at the prior of its payment's day: one estimate
        per distinct day of the batch, then Bayes' rule in plain float arithmetic (the scoring path)."""
        priors = {day: self.prior(day) for day in set(days)}
        return [score if priors[day] == self.source_prior else float(shift_prior(score, self.source_prior, priors[day]))
                for score, day in zip(scores, days, strict=True)]

    def probability(self, score: float, day: int) -> float:
        """``score`` (calibrated at the source prior) at the prior of ``day``."""
        return self.probabilities([score], [day])[0]

    def describe(self) -> dict[str, Any]:
        """For /health: the source prior, the latest day's estimate and how many scores stand behind it."""
        with self._lock:
            latest = max(self._days, default=None)
        if latest is None:
            return {"mode": "trailing_days", "source_prior": self.source_prior, "day": None, "prior": None,
                    "lookback_scores": 0, "correcting": False}
        prior = self.prior(latest)
        with self._lock:
            behind = sum(int(self._days[d].sum()) for d in range(latest - self.config.lookback_days, latest)
                         if d in self._days)
        return {"mode": "trailing_days", "source_prior": self.source_prior, "day": latest, "prior": prior,
                "lookback_scores": behind, "correcting": behind >= self.config.min_scores}
