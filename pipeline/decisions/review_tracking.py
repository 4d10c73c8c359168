"""The live review threshold: the version's review budget held on its own live scores.

A version's review threshold is chosen on its validation split (:mod:`.operating_points`). Live
scores drift from validation ones (a week later the fraud mix and the features' inputs have
moved), and a swapped-in version drifts differently from the one it replaces: with fixed
thresholds, a swap moved the review volume on the benchmark's e-commerce portfolio by 72%. The
team's capacity is a share of payments, so the service holds that share: the review threshold is
the score of the ``ceil(review_rate * n)``-th highest of the version's last ``window`` live scores
(the rule of :func:`~.operating_points.threshold_for_rate`), refreshed every ``refresh_every``
scores.

Guards, each because the quantile alone would be wrong:

* until ``min_scores`` scores are in the window, the validation threshold decides: a quantile of few
  scores is noise. A version swapped in or restarted does not start empty: its window is primed with
  its scores on the payments the service saw just before (:meth:`ReviewThresholdTracker.prime`), so
  it holds the budget from its first decision wherever that recent traffic is large enough;
* the threshold stays within ``[validation / max_factor, validation * max_factor]``: a broken
  feature that collapses every score must not turn the top 0.5% of garbage into alerts, nor a
  burst of real fraud push the bar out of reach (the review-rate check on /health and the
  live-model monitor are what report those);
* it never exceeds the block threshold (blocked payments are part of the flagged share).

The block threshold is not tracked: it is a precision target, which live scores without labels
cannot measure. Pure apart from its lock: the scoring path calls :meth:`ReviewThresholdTracker.observe`
once per batch (a copy into a ring; every ``refresh_every`` scores one ``np.partition`` of the
window, ~0.3 ms for 50,000 scores); readers take :attr:`~ReviewThresholdTracker.threshold`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pipeline.config import ConfigError
from pipeline.decisions.operating_points import rank_for_rate

TrackingMode = Literal["live_quantile", "fixed"]


@dataclass(frozen=True)
class ReviewTrackingConfig:
    """``[decision.review_tracking]`` of serving.toml."""

    # "live_quantile": hold the review budget on the version's live scores; "fixed": its validation
    # threshold for as long as it serves (the review rate then moves with its scores).
    mode: TrackingMode = "live_quantile"
    window: int = 50_000  # live scores the quantile is taken over (250 flags at a 0.5% budget: +-6% noise)
    min_scores: int = 10_000  # fewer seen: the validation threshold decides (50 flags: too noisy below)
    refresh_every: int = 1_000  # scores between two recomputations of the quantile
    max_factor: float = 4.0  # the threshold stays within [validation / max_factor, validation * max_factor]

    def __post_init__(self) -> None:
        problems = []
        if self.mode not in ("live_quantile", "fixed"):
            problems.append(f'decision.review_tracking.mode must be "live_quantile" or "fixed", got {self.mode!r}')
        if not 1 <= self.min_scores <= self.window:
            problems.append(f"decision.review_tracking needs 1 <= min_scores <= window, got min_scores "
                            f"{self.min_scores} and window {self.window}")
        if self.refresh_every < 1:
            problems.append(f"decision.review_tracking.refresh_every must be >= 1, got {self.refresh_every}")
        if not self.max_factor >= 1.0:
            problems.append(f"decision.review_tracking.max_factor must be >= 1 (1: never move), got {self.max_factor}")
        if problems:
            raise ConfigError("; ".join(problems))


class ReviewThresholdTracker:
    """One live version's review threshold, held at ``review_rate`` of its recent live scores."""

    def __init__(self, review_rate: float, validation_threshold: float, block_threshold: float,
                 config: ReviewTrackingConfig) -> None:
        self.review_rate = review_rate
        self.validation_threshold = validation_threshold
        self.config = config
        self._low = validation_threshold / config.max_factor
        self._high = min(validation_threshold * config.max_factor, block_threshold)
        self._ring = np.empty(config.window, dtype=np.float64)
        self._filled = 0  # scores in the ring (<= window)
        self._next = 0  # where the next score goes
        self._since_refresh = 0
        self._seen = 0
        self._primed = 0
        self._quantile: float | None = None  # the window's unclipped quantile at the last refresh
        self._threshold = validation_threshold
        self._lock = threading.Lock()  # the scoring thread and /score/batch's threads both observe

    @property
    def bounds(self) -> tuple[float, float]:
        """The lowest and highest review threshold it may reach."""
        return self._low, self._high

    @property
    def threshold(self) -> float:
        """The review threshold deciding now."""
        return self._threshold

    def observe(self, scores: np.ndarray) -> None:
        """Add a batch of live scores (non-finite ones are skipped: they are never flagged)."""
        s = self._usable(scores)
        if s.size == 0:
            return
        with self._lock:
            self._append(s)
            self._seen += s.size
            self._since_refresh += s.size
            if self._filled >= self.config.min_scores and self._since_refresh >= self.config.refresh_every:
                self._refresh()

    def prime(self, scores: np.ndarray) -> None:
        """Start from the version's scores on the payments the service saw just before it went live
        (:mod:`pipeline.serving.recent_traffic`): the window is filled as if it had decided them, and
        the quantile is taken at once when they reach ``min_scores``. Once per version, before it decides."""
        s = self._usable(scores)
        if s.size == 0:
            return
        with self._lock:
            self._append(s)
            self._primed += s.size
            if self._filled >= self.config.min_scores:
                self._refresh()

    def _usable(self, scores: np.ndarray) -> np.ndarray:
        """The finite scores of a batch (a NaN is never flagged), at most the window's newest."""
        s = np.asarray(scores, dtype=np.float64).ravel()
        return s[np.isfinite(s)][-self.config.window:]

    @property
    def primed(self) -> int:
        """Scores of the recent traffic it started from (0: it starts from its own live scores only)."""
        return self._primed

    def _append(self, s: np.ndarray) -> None:
        n, start = self.config.window, self._next
        first = min(s.size, n - start)
        self._ring[start:start + first] = s[:first]
        self._ring[:s.size - first] = s[first:]  # wraps to the front
        self._next = (start + s.size) % n
        self._filled = min(n, self._filled + s.size)

    def _refresh(self) -> None:
        window = self._ring[:self._filled]
        k = rank_for_rate(window.size, self.review_rate)
        self._quantile = float(np.partition(window, window.size - k)[window.size - k])  # the k-th highest
        self._threshold = float(min(max(self._quantile, self._low), self._high))
        self._since_refresh = 0

    def describe(self) -> dict[str, Any]:
        """For /health and the logs: where the threshold stands and why."""
        with self._lock:
            clipped = self._quantile is not None and self._quantile != self._threshold
            return {"mode": "live_quantile", "review_threshold": self._threshold,
                    "validation_threshold": self.validation_threshold, "review_rate": self.review_rate,
                    "scores_seen": self._seen, "primed_scores": self._primed, "window_scores": self._filled,
                    "tracking": self._filled >= self.config.min_scores,
                    "bounds": [self._low, self._high], "at_bound": clipped,
                    "window_quantile": self._quantile}
