"""/health's check of the realised review rate against the live version's review budget.

The review rate over the last ``[alerts] review_rate_window_s`` (:mod:`.rates`) is judged against
the band ``[budget * (1 - rate_band), budget * (1 + rate_band)]`` around the live version's budget
(``review_rate`` of the operating points it decides with). States:

* ``not_judged``: nothing to judge against or with: no live version, thresholds without a budget
  (serving.toml's explicit ones, as an override or for a version that ships none; or operating
  points that were themselves explicit), or fewer than ``min_payments`` payments in the window
  (low traffic cannot be judged);
* ``in_band``;
* ``outside_band``: outside, for less than ``degraded_after_s`` so far;
* ``degraded``: outside for at least ``degraded_after_s``, without a check in between that found it
  in band or could not judge. /health then says ``status: "degraded"`` (still HTTP 200: the
  service decides, but not at the volume the risk team planned for).

:func:`judge_review_rate` is the pure judgement of one window; :class:`ReviewRateCheck` keeps how
long it has been outside, checked every ``check_interval_s`` and at every GET /health.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.serving.config import AlertsConfig
from pipeline.serving.rates import DecisionRates, WindowCounts
from pipeline.serving.reloader import LiveVersion

State = Literal["not_judged", "in_band", "outside_band", "degraded"]


@dataclass(frozen=True)
class Judgement:
    """One window against one budget: ``state`` is not_judged, in_band or outside_band."""

    state: State
    reason: str
    budget: float | None = None
    band: tuple[float, float] | None = None


def rate_band(budget: float, band: float) -> tuple[float, float]:
    """``[budget * (1 - band), budget * (1 + band)]``, the low end at least 0."""
    return max(0.0, budget * (1.0 - band)), budget * (1.0 + band)


def judge_review_rate(counts: WindowCounts, live: LiveVersion | None, config: AlertsConfig) -> Judgement:
    """Is the review rate of ``counts`` inside the band around ``live``'s budget? Pure."""
    if live is None:
        return Judgement("not_judged", "no model is live")
    thresholds = live.thresholds
    budget = thresholds.budget
    if budget is None:
        why = {"config": 'decision.thresholds = "config": serving.toml\'s explicit thresholds decide',
               "config_fallback": f"version {live.version} ships no operating points and serves with "
                                  "serving.toml's explicit thresholds",
               "version": f"version {live.version}'s operating points are explicit thresholds"}[thresholds.source]
        return Judgement("not_judged", f"{why}: there is no review budget, so the review rate is not checked")
    low, high = band = rate_band(budget.review_rate, config.rate_band)
    if counts.scored < config.min_payments:
        return Judgement("not_judged", f"{counts.scored} payments in the last {counts.window_s} s, fewer than "
                         f"alerts.min_payments = {config.min_payments}: too few to judge the review rate",
                         budget.review_rate, band)
    rate = counts.flagged / counts.scored
    where = (f"the review rate over the last {counts.window_s} s is {rate:.3%} ({counts.flagged} of {counts.scored} "
             f"payments flagged), {{}} the band [{low:.3%}, {high:.3%}] around version {live.version}'s budget "
             f"of {budget.review_rate:.3%}")
    if low <= rate <= high:
        return Judgement("in_band", where.format("inside"), budget.review_rate, band)
    return Judgement("outside_band", where.format("outside"), budget.review_rate, band)


@dataclass(frozen=True)
class RateCheckResult:
    state: State
    reason: str
    window: WindowCounts
    budget: float | None
    band: tuple[float, float] | None
    outside_for_s: float | None  # how long it has been outside the band (None: it is not)
    degraded_after_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "window_s": self.window.window_s,
                "payments": self.window.scored, "review_rate": self.window.review_rate, "budget": self.budget,
                "band": None if self.band is None else list(self.band), "outside_for_s": self.outside_for_s,
                "degraded_after_s": self.degraded_after_s}


class ReviewRateCheck:
    """The review-rate judgement over time: degraded once outside the band for ``degraded_after_s``."""

    def __init__(self, config: AlertsConfig, rates: DecisionRates, live: Callable[[], LiveVersion | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.rates = rates
        self._live = live
        self._clock = clock
        self._outside_since: float | None = None
        self._lock = threading.Lock()  # the periodic check and GET /health may run it together

    def check(self) -> RateCheckResult:
        """Judge the window now, and remember since when it has been outside the band."""
        counts = self.rates.window(self.config.review_rate_window_s)
        judged = judge_review_rate(counts, self._live(), self.config)
        with self._lock:
            now = self._clock()
            if judged.state != "outside_band":
                self._outside_since = None  # back in band, or not judged: the time outside starts again
                return RateCheckResult(judged.state, judged.reason, counts, judged.budget, judged.band, None,
                                       self.config.degraded_after_s)
            if self._outside_since is None:
                self._outside_since = now
            outside_for = now - self._outside_since
        degraded = outside_for >= self.config.degraded_after_s
        reason = (f"{judged.reason}, for {outside_for:.0f} s"
                  + (f" (alerts.degraded_after_s = {self.config.degraded_after_s:g})" if degraded else
                     f" (degraded after {self.config.degraded_after_s:g} s)"))
        return RateCheckResult("degraded" if degraded else "outside_band", reason, counts, judged.budget, judged.band,
                               outside_for, self.config.degraded_after_s)
