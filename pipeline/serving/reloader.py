"""Follow a registry alias and hot-swap the model that serves, without failing a request.

:meth:`ModelReloader.sync` (called at start, every ``poll_interval_s`` and by the admin endpoints)
reads the version the alias names, or the pinned one. When it differs from the live version it
fetches the version, checks its feature schema, settles the thresholds it will decide with
(:func:`.thresholds.thresholds_for`: its operating points, or serving.toml's) and warms it up, all
beside the live model, and only then replaces the one reference requests read
(:attr:`ModelReloader.active`, a :class:`LiveVersion`: model and thresholds together). A request
takes that reference once and finishes on the model and thresholds it took, so requests in flight
complete on the old version and none fail; the old model is freed when the last of them finishes.

A version that fails to load (a refused one included: no operating points under ``"refuse"``, a
corrupt operating-points file) changes nothing: the live model keeps serving, and the failure is
kept (``last_error``, the failure counter) for /health and /metrics. A failed version is retried
with a doubling back-off (a transient artifact-store error heals; a corrupt model does not spin).
Promotions and rollbacks both just move the alias, so both reach the service the same way.

A version's review threshold does not start from its validation days alone: before it goes live its
tracker is primed with its own scores on the latest payments the service saw
(:mod:`.recent_traffic`), so the budget it is held to is the share of today's traffic, not of days
weeks older. A version that went live before the features were seeded is primed once they are.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.decisions.prior_tracking import LivePriorTracker
from pipeline.decisions.review_tracking import ReviewThresholdTracker
from pipeline.serving.config import DecisionConfig, ModelConfig
from pipeline.serving.errors import ServingError
from pipeline.serving.model_source import ModelSource
from pipeline.serving.recent_traffic import RecentTraffic
from pipeline.serving.scorer import FeatureRow, Scorer
from pipeline.serving.thresholds import Thresholds, prior_tracker, review_tracker, thresholds_for

log = logging.getLogger(__name__)

MAX_RETRY_BACKOFF_S = 600.0


@dataclass(frozen=True)
class LiveVersion:
    """What one swap puts live: a version's scorer and the thresholds it decides with."""

    scorer: Scorer
    thresholds: Thresholds  # as the version ships them (or serving.toml's)
    tracker: ReviewThresholdTracker | None = None  # its review threshold held at the budget on live scores
    prior: LivePriorTracker | None = None  # the fraud rate its probabilities are served at

    @property
    def version(self) -> int:
        return self.scorer.version

    def deciding(self) -> Thresholds:
        """The thresholds deciding now: the version's, with the tracked review threshold when tracked.
        Read once per batch, so that a batch is decided and counted at one pair."""
        if self.tracker is None:
            return self.thresholds
        return dataclasses.replace(self.thresholds, review_threshold=self.tracker.threshold)

    def probabilities(self, scores: Sequence[float], days: Sequence[int]) -> list[float | None]:
        """The scores as probabilities at the live prior of each payment's UTC day (None untracked)."""
        if self.prior is None:
            return [None] * len(scores)
        return self.prior.probabilities(scores, days)

    def observe(self, scores: Sequence[float], days: Sequence[int] | None = None) -> None:
        """Feed a decided batch's scores to the trackers (after deciding it: no batch sees its own
        scores); ``days``, the payments' UTC days, for the live prior (the shadow has none)."""
        if self.tracker is None and (self.prior is None or days is None):
            return
        values = np.fromiter(scores, dtype=np.float64, count=len(scores))
        if self.tracker is not None:
            self.tracker.observe(values)
        if self.prior is not None and days is not None:
            self.prior.observe(np.fromiter(days, dtype=np.int64, count=len(days)), values)


@dataclass(frozen=True)
class LoadFailure:
    version: int | None  # None: the alias itself could not be read
    at: float  # epoch seconds
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "at": self.at, "message": self.message}


class ModelReloader:
    """The live model for one alias (``champion``, or ``challenger`` for shadow scoring)."""

    def __init__(self, source: ModelSource, alias: str, config: ModelConfig, warmup: Sequence[FeatureRow],
                 decision: DecisionConfig, recent: RecentTraffic | None = None) -> None:
        self.source = source
        self.recent = recent  # the latest payments' features: a version's review threshold starts there
        self.alias = alias
        self.config = config
        self.decision = decision
        self.warmup = list(warmup)
        self._active: LiveVersion | None = None
        self._lock = threading.Lock()  # one load at a time (poller and admin calls)
        self.pinned: int | None = None
        self.alias_version: int | None = None  # what the alias named at the last successful read
        self.last_error: LoadFailure | None = None
        self.loads: Counter[str] = Counter()  # "success" / "failure" (a version) / "alias_error" (registry)
        self._retry: dict[int, tuple[float, int]] = {}  # failed version -> (not before, attempts)

    @property
    def active(self) -> LiveVersion | None:
        """The version serving now (model and thresholds); read it once per request."""
        return self._active

    def sync(self, force: bool = False) -> bool:
        """Bring the live model to the alias's (or pinned) version; True when a new model went live.

        ``force`` reloads even the live version and ignores the retry back-off.
        """
        with self._lock:
            try:
                self.alias_version = self.source.alias_version(self.alias)
            except Exception as exc:  # registry unreachable: keep serving what is live
                self._record_failure(None, f"cannot read alias {self.alias!r} of {self.source.model_name!r}: {exc}",
                                     "alias_error")
                return False
            target = self.pinned if self.pinned is not None else self.alias_version
            if target is None:
                return False
            live = self._active.version if self._active is not None else None
            if target == live and not force:
                return False
            not_before, _ = self._retry.get(target, (0.0, 0))
            if not force and time.time() < not_before:
                return False
            return self._load(target)

    def pin(self, version: int | None) -> LiveVersion | None:
        """Serve ``version`` regardless of the alias (``None``: follow the alias again).

        Raises ServingError when the version cannot serve; the live model and the pin stay as they were.
        """
        if version is None:
            with self._lock:
                self.pinned = None
            self.sync()
            return self._active
        with self._lock:
            if not self._load(version):
                raise ServingError(f"cannot pin version {version}: {self.last_error.message}")
            self.pinned = version
            return self._active

    def _load(self, version: int) -> bool:
        started = time.monotonic()
        try:
            fetched = self.source.fetch(version)
            thresholds = thresholds_for(version, fetched.operating_points, self.decision)
            tracker = review_tracker(thresholds, self.decision.review_tracking)
            prior = prior_tracker(fetched.operating_points, self.decision.prior_tracking)
            lowest_review = tracker.bounds[0] if tracker else thresholds.review_threshold
            # Every payment the version flags is explained, however low its review threshold goes.
            scorer = Scorer(fetched.model, version, self.config.explain_top_k,
                            min(self.config.explain_min_score, lowest_review))
            scorer.warm_up(self.warmup)
            self._prime(tracker, scorer)
        except Exception as exc:  # fetch, schema and warm-up failures alike: the live model stays
            _, attempts = self._retry.get(version, (0.0, 0))
            backoff = min(self.config.poll_interval_s * 2 ** attempts, MAX_RETRY_BACKOFF_S)
            self._retry[version] = (time.time() + backoff, attempts + 1)
            self._record_failure(version, f"{type(exc).__name__}: {exc}", "failure")
            return False
        previous = self._active
        self._active = LiveVersion(scorer, thresholds, tracker, prior)  # the swap: one reference assignment
        self._retry.pop(version, None)
        self.loads["success"] += 1
        log.info("%s: version %s live (was %s), loaded in %.2fs; review >= %.4g, block >= %.4g (%s)", self.alias,
                 version, previous.version if previous else None, time.monotonic() - started,
                 thresholds.review_threshold, thresholds.block_threshold, thresholds.source)
        if thresholds.warning:
            log.warning("%s: %s", self.alias, thresholds.warning)
        return True

    def prime_active(self) -> None:
        """Prime the live version's review threshold from the recent traffic, if it went live before
        there was any (a service whose model loads before its features are seeded)."""
        with self._lock:
            active = self._active
            if active is not None and active.tracker is not None and active.tracker.primed == 0:
                self._prime(active.tracker, active.scorer)

    def _prime(self, tracker: ReviewThresholdTracker | None, scorer: Scorer) -> None:
        """Start ``tracker`` from ``scorer``'s scores on the recent traffic (nothing when there is none)."""
        if tracker is None or self.recent is None or not len(self.recent):
            return
        started = time.monotonic()
        tracker.prime(np.asarray(scorer.score_matrix(self.recent.matrix(), self.recent.columns)))
        log.info("%s: version %s's review threshold starts from its scores on the %d latest payments: %.4g "
                 "(validation: %.4g; %.2fs)", self.alias, scorer.version, tracker.primed, tracker.threshold,
                 tracker.validation_threshold, time.monotonic() - started)

    def _record_failure(self, version: int | None, message: str, kind: str) -> None:
        self.loads[kind] += 1
        self.last_error = LoadFailure(version, time.time(), message)
        log.warning("%s: %s (the live model, version %s, keeps serving)", self.alias, message,
                    self._active.version if self._active else None)

    def status(self) -> dict[str, Any]:
        active = self._active
        return {"alias": self.alias, "version": active.version if active else None,
                "loaded_at": active.scorer.loaded_at if active else None, "alias_version": self.alias_version,
                "forward": active.scorer.forward if active else None,
                "thresholds": active.deciding().to_dict() if active else None,
                "review_tracking": (active.tracker.describe() if active.tracker else {"mode": "fixed"}) if active
                else None,
                "prior_tracking": (active.prior.describe() if active.prior else {"mode": "off"}) if active else None,
                "pinned": self.pinned, "loads": dict(self.loads),
                "last_error": self.last_error.to_dict() if self.last_error else None}
