"""Pure: one model version's realised figures on a monitored day, and what they are compared with.

Each payment is judged at the thresholds it was decided at (the event's ``review_threshold`` and
``block_threshold``), with the definitions of :mod:`pipeline.decisions.operating_points`: flagged =
score >= review threshold (blocks included), blocked = score >= block threshold. Recall and
precision are those of the flagged payments; the alert rate is the flagged share, compared with
the version's review budget. Scores drift against the version's validation scores
(:func:`pipeline.metrics.population_stability_index`), features against its training split
(:mod:`pipeline.monitoring.drift`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.decisions.operating_points import OperatingPoints, SplitFigures, split_figures
from pipeline.metrics import (
    auc_roc,
    auc_upper_bound,
    average_precision,
    between_day_auc_variance,
    population_stability_index,
)
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.drift import broken_inputs, feature_psi, out_of_range_features
from pipeline.monitoring.join import ScoredPayment
from pipeline.monitoring.missed_frauds import MissedFraudReference, MissedFrauds, missed_frauds

SHOWN_DRIFTING = 5  # features named in a drift finding


@dataclass(frozen=True)
class RankingExpectation:
    """What a version's day of payments is expected to rank like, from its validation split."""

    auc: float  # the validation AUC
    between_days: float  # variance of a day's AUC around it from day to day, beyond the day's own DeLong variance


def ranking_expectation(labels, scores, event_times, cards) -> RankingExpectation | None:
    """The validation split's AUC, and how much its days' AUCs spread beyond their own bounds (by UTC
    event date, cards as clusters: :func:`pipeline.metrics.between_day_auc_variance`); None without
    both classes."""
    auc = auc_roc(labels, scores)
    if not math.isfinite(auc):
        return None
    days = pd.to_datetime(pd.Series(event_times), utc=True).dt.date.to_numpy()
    return RankingExpectation(auc, between_day_auc_variance(labels, scores, days, cards))


def day_ranking(labels, scores, cards, expectation: RankingExpectation | None,
                confidence: float) -> tuple[float, float]:
    """A day's AUC and the one-sided upper bound the monitor compares with its floor: the day's DeLong
    variance by card, plus the validation days' spread between days (a healthy day's fraud mix moves)."""
    return auc_upper_bound(labels, scores, cards, confidence, expectation.between_days if expectation else 0.0)


@dataclass(frozen=True)
class VersionReference:
    """What the registry holds about a version: what its live figures are judged against."""

    version: int
    run_id: str | None  # None: the version is not in the registry
    operating_points: OperatingPoints | None
    expected_recall: float | None
    expected_recall_source: str  # the tag it came from, or "none"
    validation_scores: np.ndarray | None
    training_features: dict[str, np.ndarray] | None  # a sample of the training split, by feature
    training_sample: str  # how that sample was drawn, for the report
    categorical: frozenset[str]
    notes: tuple[str, ...] = ()  # what could not be found, and why
    ranking: RankingExpectation | None = None  # from the run's validation scores: what a day's ranking is judged against
    missed_frauds: MissedFraudReference | None = None  # the validation split's fraud cards that got through, per payment


@dataclass(frozen=True)
class VersionFigures:
    version: int
    at_operating_points: SplitFigures  # rows, frauds, review/block rate, recall, precision, block precision
    auc_roc: float
    average_precision: float
    review_thresholds: tuple[float, ...]  # distinct thresholds the day's decisions used
    block_thresholds: tuple[float, ...]
    review_budget: float | None
    review_rate_vs_budget: float | None  # realised review rate / budget
    alert_rate_in_band: bool | None
    score_psi: float
    feature_psi: dict[str, float]
    stuck_features: tuple[str, ...]  # served features stuck at one value, all day or in one segment: broken inputs
    out_of_range_features: tuple[str, ...]  # payment fields outside their training range: broken inputs
    live_feature_rows: int
    findings: tuple[str, ...]
    auc_upper: float = math.nan  # auc_roc's one-sided upper bound at the monitor's confidence, by card
    missed: MissedFrauds | None = None  # the day's fraud cards that got through vs validation's (None: no reference)


def version_figures(payments: list[ScoredPayment], labels: np.ndarray, reference: VersionReference,
                    config: MonitoringConfig, cards: dict[str, str] | None = None) -> VersionFigures:
    """Figures of one version's payments (``labels`` aligned with them) against its ``reference``;
    ``cards`` (transaction id -> card id) group a card's frauds in the AUC's bound."""
    scores = np.array([p.score for p in payments], dtype=np.float64)
    review = np.array([p.review_threshold for p in payments], dtype=np.float64)
    block = np.array([p.block_threshold for p in payments], dtype=np.float64)
    # Arrays, not one threshold: each payment is judged at the thresholds it was decided at.
    at_points = split_figures(labels, scores, review, block)  # type: ignore[arg-type]
    findings = list(reference.notes)
    findings += _threshold_findings(review, block, reference.operating_points)
    budget = reference.operating_points.review_budget if reference.operating_points else None
    ratio = in_band = None
    if budget is not None and at_points.rows:
        ratio = at_points.review_rate / budget
        in_band = abs(ratio - 1.0) <= config.alert_rate_band
        if not in_band:
            findings.append(f"review rate {at_points.review_rate:.3%} is {ratio:.2f}x the budget {budget:.3%} "
                            f"(band: x{1 - config.alert_rate_band:g}..x{1 + config.alert_rate_band:g})")
    score_psi = math.nan
    if reference.validation_scores is not None and scores.size:
        score_psi = population_stability_index(reference.validation_scores, scores)
        if score_psi > config.score_psi_warn:
            findings.append(f"live scores drifted from validation: PSI {score_psi:.3f} > {config.score_psi_warn:g}")
    drift: dict[str, float] = {}
    stuck: tuple[str, ...] = ()
    out_of_range: tuple[str, ...] = ()
    if reference.training_features is not None:
        served = {name: np.array([p.features.get(name, math.nan) for p in payments], dtype=np.float64)
                  for name in reference.training_features}
        never_served = sorted(n for n, v in served.items() if np.isnan(v).all())
        served = {n: v for n, v in served.items() if n not in never_served}
        drift = feature_psi(reference.training_features, served, set(reference.categorical), config.feature_bins)
        stuck = broken_inputs(reference.training_features, served, config.stuck_feature_share,
                              config.segment_features, config.segment_kept)
        out_of_range = out_of_range_features(reference.training_features, served, config.range_features,
                                             config.out_of_range_share)
        findings += _drift_findings(drift, config, never_served)
    clusters = [(cards or {}).get(p.transaction_id, p.transaction_id) for p in payments]
    return VersionFigures(
        version=reference.version, at_operating_points=at_points, auc_roc=auc_roc(labels, scores),
        auc_upper=day_ranking(labels, scores, clusters, reference.ranking, config.confidence)[1],
        missed=(missed_frauds(labels, scores >= review, clusters, reference.missed_frauds, config.confidence)
                if reference.missed_frauds is not None else None),
        average_precision=average_precision(labels, scores),
        review_thresholds=tuple(sorted({float(x) for x in review})), block_thresholds=tuple(sorted({float(x) for x in block})),
        review_budget=budget, review_rate_vs_budget=ratio, alert_rate_in_band=in_band, score_psi=score_psi,
        feature_psi=drift, stuck_features=stuck, out_of_range_features=out_of_range, live_feature_rows=len(payments),
        findings=tuple(findings))


def _threshold_findings(review: np.ndarray, block: np.ndarray, points: OperatingPoints | None) -> list[str]:
    if points is None or review.size == 0:
        return []
    # Only the block threshold: the review threshold moves by design when serving holds the budget on
    # live scores (pipeline.decisions.review_tracking); the day's range of it is in the report.
    off = block != points.block_threshold
    if not off.any():
        return []
    return [f"{int(off.sum())} of {review.size} decisions were made at thresholds other than the version's "
            f"operating points (review >= {points.review_threshold:.4g}, block >= {points.block_threshold:.4g}): "
            "an explicit override in serving.toml? Recall is measured at the thresholds used"]


def _drift_findings(drift: dict[str, float], config: MonitoringConfig, never_served: list[str]) -> list[str]:
    findings = []
    shifted = sorted(((v, n) for n, v in drift.items() if v > config.feature_psi_warn), reverse=True)
    if shifted:
        named = ", ".join(f"{n} {v:.2f}" for v, n in shifted[:SHOWN_DRIFTING])
        more = f" and {len(shifted) - SHOWN_DRIFTING} more" if len(shifted) > SHOWN_DRIFTING else ""
        findings.append(f"served features drifted from the training split (PSI > {config.feature_psi_warn:g}): "
                        f"{named}{more}")
    if never_served:
        findings.append(f"training features absent from every score event (no PSI): {', '.join(never_served)}")
    return findings
