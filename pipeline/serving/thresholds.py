"""The thresholds a loaded version decides with: its own operating points, or serving.toml's.

A version ships its operating points (:mod:`pipeline.decisions.operating_points`: review and block
thresholds chosen from a review budget on its validation split) in ``operating_points.json``
beside its weights. :func:`thresholds_for` turns them, with ``[decision]`` of serving.toml, into
the :class:`Thresholds` the version serves with; the reloader puts both live in one swap, so a
request never sees one version's model with another's thresholds. Pure.

* ``thresholds = "version"`` (the default): the version's operating points (``source = "version"``).
  A version without them: ``without_operating_points = "config"`` serves it with serving.toml's
  thresholds and a warning (``source = "config_fallback"``); ``"refuse"`` raises
  :class:`ModelRejected` (it does not load; the live version keeps serving).
* ``thresholds = "config"``: serving.toml's ``review_threshold`` / ``block_threshold`` for every
  version, whatever it ships (``source = "config"``: an override, logged at start).

With ``[decision.review_tracking] mode = "live_quantile"`` (the default), thresholds that come with a
budget get a :class:`~pipeline.decisions.review_tracking.ReviewThresholdTracker` (:func:`review_tracker`):
the version's review threshold then follows its live scores to hold the budget, starting from the
validation threshold; explicit thresholds (override, fallback) decide as given.

A corrupt ``operating_points.json`` never gets here: the model source refuses the version.

Only ``source = "version"`` thresholds come with a budget (:attr:`Thresholds.budget`), which is
what the realised review rate is judged against; explicit thresholds have none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.decisions.operating_points import DecisionBudget, OperatingPoints
from pipeline.decisions.prior_tracking import LivePriorTracker, PriorTrackingConfig
from pipeline.decisions.review_tracking import ReviewThresholdTracker, ReviewTrackingConfig
from pipeline.serving.config import DecisionConfig
from pipeline.serving.errors import ModelRejected

ThresholdSource = Literal["version", "config", "config_fallback"]


@dataclass(frozen=True)
class Thresholds:
    """Score thresholds of one version's decisions: flagged at ``>= review_threshold``, blocked at
    ``>= block_threshold``; where they came from, and the version's own operating points."""

    review_threshold: float
    block_threshold: float
    source: ThresholdSource
    points: OperatingPoints | None = None  # what the version ships (None: nothing)
    warning: str | None = None  # set for a fallback: shown on /health

    @property
    def budget(self) -> DecisionBudget | None:
        """The review budget these thresholds realise; None for explicit ones (override, fallback, or
        operating points that were themselves explicit)."""
        return self.points.budget if self.source == "version" and self.points is not None else None

    def to_dict(self) -> dict[str, Any]:
        budget = self.budget
        return {"source": self.source, "review_threshold": self.review_threshold,
                "block_threshold": self.block_threshold,
                "budget": None if budget is None else {"review_rate": budget.review_rate,
                                                       "block_precision": budget.block_precision,
                                                       "block_rate": budget.block_rate},
                "operating_points": None if self.points is None else self.points.describe(),
                "warning": self.warning}


def config_thresholds(config: DecisionConfig, source: ThresholdSource = "config",
                      points: OperatingPoints | None = None, warning: str | None = None) -> Thresholds:
    """serving.toml's explicit ``review_threshold`` / ``block_threshold``."""
    return Thresholds(config.review_threshold, config.block_threshold, source, points, warning)


def thresholds_for(version: int, points: OperatingPoints | None, config: DecisionConfig) -> Thresholds:
    """The thresholds ``version`` serves with, given the operating points it ships (None: none).

    Raises ModelRejected for a version without operating points under
    ``without_operating_points = "refuse"`` (and ``thresholds = "version"``).
    """
    if config.thresholds == "config":
        return config_thresholds(config, "config", points)
    if points is not None:
        return Thresholds(points.review_threshold, points.block_threshold, "version", points)
    if config.without_operating_points == "refuse":
        raise ModelRejected(
            f"version {version} ships no operating points (operating_points.json: it was packaged before they "
            "existed) and serving.toml has decision.without_operating_points = \"refuse\". Register a version "
            "whose training run was finalised with a [decisions] budget (or roll back to one), or set "
            "decision.without_operating_points = \"config\" to serve it with decision.review_threshold / "
            "block_threshold")
    return config_thresholds(config, "config_fallback", None, (
        f"version {version} ships no operating points: deciding with serving.toml's review_threshold "
        f"{config.review_threshold:g} and block_threshold {config.block_threshold:g}, which no review budget "
        "backs (the review rate is not checked); register a version finalised with a [decisions] budget"))


def prior_tracker(points: OperatingPoints | None, config: PriorTrackingConfig) -> LivePriorTracker | None:
    """The live prior of a version whose operating points record the mean of its calibrated
    validation scores (its source prior), under ``mode = "trailing_days"``; None otherwise (a version
    packaged before they recorded it serves its scores as probabilities, as before)."""
    source = points.validation.mean_score if points is not None and points.validation is not None else math.nan
    if config.mode != "trailing_days" or not 0.0 < source < 1.0:
        return None
    return LivePriorTracker(source, config)


def review_tracker(thresholds: Thresholds, config: ReviewTrackingConfig) -> ReviewThresholdTracker | None:
    """The tracker of a version's review threshold: for thresholds backed by a budget under
    ``mode = "live_quantile"``; None otherwise (explicit thresholds are an instruction, not a budget)."""
    budget = thresholds.budget
    if config.mode != "live_quantile" or budget is None:
        return None
    return ReviewThresholdTracker(budget.review_rate, thresholds.review_threshold, thresholds.block_threshold, config)
