"""Which monitored days each model version fell short on, and the ``degraded`` rule over them.

A version is ``degraded`` on day ``D`` when its realised recall at the operating points was below
``expected - recall_margin`` on ``degraded_after_days`` judged days in a row, ending with ``D``; or
at once when a served input was broken that day: a feature stuck at one value while it varied in
training, over the whole day or within one segment such as a channel (``stuck_feature_share``,
``segment_features``, :func:`pipeline.monitoring.drift.broken_inputs`), or a payment field outside
its training range (``range_features``, :func:`pipeline.monitoring.drift.out_of_range_features`).
A broken input is certain from the features alone, while the recall it costs can hide in a day's
noise. With ``confidence`` > 0 a day is below only when the recall's one-sided upper bound at that confidence
(:func:`pipeline.metrics.binomial_upper_bound`, exact, over the day's matured frauds) is below
the floor: a day of 30 frauds varies by about 0.09 in recall from chance alone, and a point comparison
reads that as degradation (the decisions bench's healthy champion had 2 such days in 7). The bound is
exact, not Wilson's, because days of 5-15 matured frauds are common and Wilson's is too low there: it
called 0 of 6 below a floor of 0.36, which chance does 7% of the time (2 false alarms in the quick bench).
A judged day also falls short when its frauds are ranked below the version's validation AUC by more
than ``auc_margin`` (the AUC's one-sided upper bound at ``confidence``, card-clustered DeLong, on days
of at least ``auc_min_frauds`` matured frauds): where the
review budget caps recall low (a 4%-fraud portfolio reviewing 0.5% of its payments), a day's recall
cannot fall far enough to tell, while frauds of a pattern the model never learned sit among the
genuine payments and pull the AUC down (the decisions bench's new-pattern fault). And with
``missed_fraud_factor`` > 1 a judged day falls short when its fraud cards that got past the model
(none of a card's frauds flagged) per payment are more than that factor times the validation
split's rate, by the ratio's one-sided lower bound at ``confidence``
(:mod:`pipeline.monitoring.missed_frauds`): a new pattern adds cards that get through, which the
day's recall hides where a card's frauds are caught or missed together (the decisions bench's
e-commerce week: the new pattern's days at recall 0.32, 0.41, 0.28 against a floor of 0.30, healthy
days 0.24-0.66, while its missed cards went from about 31 a day to 56, 80, 96). Any shortfall
counts toward the same run of ``degraded_after_days``.
Only judged days count (enough matured frauds and an expectation to compare with): a day with too
few frauds neither extends nor breaks the run, and days never monitored are not in the history at
all. So one noisy day never degrades a model, and a gap in monitoring does not reset the evidence.

The history is a small JSON file per version, ``<state>/monitoring/history/<model>/v<N>.json``, one
entry per monitored date (a re-run of a date replaces its entry), the latest :data:`KEEP_DAYS`
kept. Rewritten atomically; one monitor run at a time (:func:`monitor_lock`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Literal

from pipeline.atomic import write_json_atomic
from pipeline.file_lock import LockHeld, file_lock
from pipeline.metrics import binomial_upper_bound
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.drift import SEGMENT_MARK
from pipeline.monitoring.missed_frauds import MissedFrauds

KEEP_DAYS = 120
VersionState = Literal["ok", "degraded", "insufficient_evidence", "unjudged"]
# Why a version is degraded: a served feature stuck all day; collapsed to one value within one segment
# (one channel);
# a payment field outside its training range; realised recall below the floor on degraded_after_days
# judged days in a row. All but the last need no labels.
# Realised recall, or the day's ranking of its frauds (AUC), below its floor, or its missed fraud cards
# above missed_fraud_factor x validation's, on degraded_after_days judged days in a row. All but the last
# three need no labels.
DegradedRule = Literal["stuck_feature", "stuck_feature_in_segment", "out_of_range", "recall_below_floor",
                       "ranking_below_floor", "missed_frauds_above_factor"]


class MonitoringStateError(RuntimeError):
    """The monitoring directory cannot be used as it is; the message says what to do."""


class MonitorLocked(MonitoringStateError, LockHeld):
    """Another monitor run holds the monitoring directory's lock."""


@dataclass(frozen=True)
class MonitoredDay:
    date: str
    frauds: int
    recall: float | None  # realised, at the operating points (None: no frauds)
    expected_recall: float | None  # None: nothing to compare with
    recall_floor: float | None  # expected - margin
    judged: bool  # enough frauds and an expectation
    below: bool  # judged and short: recall_upper < floor, or ranking_below
    recall_upper: float | None = None  # what is compared with the floor: the recall's upper bound (or itself)
    broken_features: tuple[str, ...] = ()  # served features stuck at one value that day (all day, or "<f>@<segment>")
    out_of_range_features: tuple[str, ...] = ()  # served features outside their training range that day
    auc: float | None = None  # the day's AUC-ROC on its matured labels
    auc_upper: float | None = None  # its one-sided upper bound at ``confidence`` (card-clustered DeLong)
    expected_auc: float | None = None  # the version's validation AUC (None: not judged on ranking)
    auc_floor: float | None = None  # expected_auc - auc_margin
    ranking_below: bool = False  # judged and auc_upper < auc_floor
    missed_fraud_cards: int | None = None  # cards with a matured fraud, none of its frauds flagged (None: not counted)
    missed_fraud_ratio: float | None = None  # their rate per payment / the validation split's
    missed_fraud_ratio_lower: float | None = None  # its one-sided lower bound at ``confidence``
    missed_above: bool = False  # judged and missed_fraud_ratio_lower > missed_fraud_factor

    @property
    def recall_below(self) -> bool:
        return (self.judged and self.recall_upper is not None and self.recall_floor is not None
                and self.recall_upper < self.recall_floor)


def judge_day(day: date, frauds: int, recall: float | None, expected: float | None,
              config: MonitoringConfig, broken: tuple[str, ...] = (),
              out_of_range: tuple[str, ...] = (), ranking: tuple[float, float] | None = None,
              expected_auc: float | None = None, missed: MissedFrauds | None = None) -> MonitoredDay:
    """One day's judgement. ``ranking``: the day's ``(AUC, its upper bound)`` on matured labels
    (:func:`pipeline.metrics.auc_upper_bound`); with ``expected_auc`` and ``auc_margin`` > 0 the day is
    also short when that bound is below ``expected_auc - auc_margin``: frauds the model ranks among the
    genuine (a pattern it never learned) lower the AUC even where the budget caps recall so low that
    a day's recall cannot move far from chance. ``missed``: the day's missed fraud cards against the
    validation split's rate (:func:`pipeline.monitoring.missed_frauds.missed_frauds`); with
    ``missed_fraud_factor`` > 0 the day is also short when the ratio's lower bound is above that factor."""
    floor = None if expected is None else expected - config.recall_margin
    judged = frauds >= config.min_frauds and floor is not None and recall is not None and math.isfinite(recall)
    upper = None
    if recall is not None and math.isfinite(recall):
        upper = (binomial_upper_bound(round(recall * frauds), frauds, config.confidence) if config.confidence > 0
                 else recall)
    auc, auc_upper = ranking if ranking is not None else (None, None)
    auc_floor = expected_auc - config.auc_margin if expected_auc is not None and config.auc_margin > 0 else None
    ranking_below = bool(judged and frauds >= config.auc_min_frauds and auc_floor is not None
                         and auc_upper is not None and math.isfinite(auc_upper) and auc_upper < auc_floor)
    ratio, lower = (missed.ratio, missed.ratio_lower) if missed is not None else (math.nan, math.nan)
    missed_above = bool(judged and config.missed_fraud_factor > 0 and math.isfinite(lower)
                        and lower > config.missed_fraud_factor)
    return MonitoredDay(day.isoformat(), frauds, recall, expected, floor, judged,
                        (judged and upper < floor) or ranking_below or missed_above, upper,  # type: ignore[operator]
                        tuple(broken), tuple(out_of_range), auc, auc_upper, expected_auc, auc_floor, ranking_below,
                        missed.cards if missed is not None else None, _finite(ratio), _finite(lower), missed_above)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def days_below_in_a_row(history: list[MonitoredDay], day: date) -> int:
    """Judged days up to ``day``, latest first, that were below the floor before the first that was not."""
    streak = 0
    for entry in sorted(history, key=lambda e: e.date, reverse=True):
        if entry.date > day.isoformat() or not entry.judged:
            continue
        if not entry.below:
            break
        streak += 1
    return streak


def degraded_by(entry: MonitoredDay, streak: int, config: MonitoringConfig) -> tuple[DegradedRule, ...]:
    """The rules that call the version degraded on ``entry``'s day (none: not degraded), in the order
    of :data:`DegradedRule`; ``streak``: :func:`days_below_in_a_row` up to that day."""
    rules: list[DegradedRule] = []
    if any(SEGMENT_MARK not in f for f in entry.broken_features):
        rules.append("stuck_feature")
    if any(SEGMENT_MARK in f for f in entry.broken_features):
        rules.append("stuck_feature_in_segment")
    if entry.out_of_range_features:
        rules.append("out_of_range")
    if entry.judged and entry.frauds >= config.min_frauds and streak >= config.degraded_after_days:
        if entry.recall_below:
            rules.append("recall_below_floor")
        if entry.ranking_below:
            rules.append("ranking_below_floor")
        if entry.missed_above:
            rules.append("missed_frauds_above_factor")
    return tuple(rules)


def version_state(entry: MonitoredDay, streak: int, config: MonitoringConfig) -> VersionState:
    if entry.broken_features or entry.out_of_range_features:
        return "degraded"
    if entry.frauds < config.min_frauds:
        return "insufficient_evidence"
    if not entry.judged:
        return "unjudged"
    return "degraded" if degraded_by(entry, streak, config) else "ok"


@dataclass(frozen=True)
class HistoryStore:
    """``<root>/history/<model>/v<N>.json`` (root: ``<state>/monitoring``)."""

    root: Path

    def path(self, model_name: str, version: int) -> Path:
        return self.root / "history" / model_name / f"v{version}.json"

    def read(self, model_name: str, version: int) -> list[MonitoredDay]:
        path = self.path(model_name, version)
        if not path.is_file():
            return []
        try:
            return [MonitoredDay(**{**d, "broken_features": tuple(d.get("broken_features", ())),
                                    "out_of_range_features": tuple(d.get("out_of_range_features", ()))})
                    for d in json.loads(path.read_text())["days"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise MonitoringStateError(f"{path} is not a monitoring history ({type(exc).__name__}: {exc}); move it away "
                             "to start the version's history afresh") from exc

    def record(self, model_name: str, version: int, entry: MonitoredDay) -> list[MonitoredDay]:
        """Add (or replace) ``entry``'s date; returns the history as written."""
        days = {d.date: d for d in self.read(model_name, version)} | {entry.date: entry}
        kept = [days[k] for k in sorted(days)][-KEEP_DAYS:]
        write_json_atomic(self.path(model_name, version), {
            "model_name": model_name, "version": version, "days": [dataclasses.asdict(d) for d in kept]})
        return kept


@contextmanager
def monitor_lock(root: Path) -> Iterator[None]:
    """Hold ``<root>/.lock`` (released by the OS if the process dies): history and reports have one writer."""
    with file_lock(root / ".lock", error=MonitorLocked, user=f"another monitor run is using {root}"):
        yield
