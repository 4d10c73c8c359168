"""``fraudctl bench decisions``: do the decisions hold the review budget, beat LightGBM at it,
survive a champion swap and get caught when the live model degrades?

For each benchmark portfolio (:mod:`pipeline.bench.dataset`, both presets), on the protocol's test
week (the holdout every model is judged on):

* our model is trained by the production job, which chooses its operating points on its
  validation split at conf/dev's ``[decisions]`` budget (what ships with a version); LightGBM is
  trained on the same train split and gets operating points from the same budget on the same
  validation split (:func:`choose_operating_points`);
* ``realised_review_rate``: the share of the test week's payments our model flags as the service
  serves it: payments in event-time order, in batches of ``SERVED_BATCH``, each decided at the review
  threshold the service would hold then (conf/dev serving.toml's ``[decision.review_tracking]``: the
  validation threshold, then the budget's quantile of the version's own recent live scores, the
  same :class:`ReviewThresholdTracker` the service runs); the validation threshold's share kept
  beside it (``realised_review_rate_fixed_threshold``);
* ``recall_at_budget`` / ``precision_at_budget``: each model flags its top ``review_rate`` share of
  the test week (:func:`pipeline.metrics.recall_at_rate`), the gate's comparison;
* ``swap_review_rate_change``: the same traffic, champion ours swapped for LightGBM (another score
  distribution, fresh at its validation threshold): the relative change of the flagged share as
  served, and beside it with each version's fixed validation thresholds and with serving.toml's
  absolute thresholds;
* ``detected_after_days``: the champion served with one feature stuck at its training median (the
  feature whose loss hurts validation recall at the budget most: the worst broken pipeline once the
  review threshold follows the scores), decided as served and judged day by day
  by the monitor's rules (:mod:`pipeline.monitoring.history`, conf/dev's monitoring.toml: recall at
  the operating points against the expectation, the fraud cards that got past the model against the
  validation split's rate, and served features against a training sample, ``stuck_feature_share``): the first test day reported ``degraded``; the healthy champion's days
  beside it (``false_alarm_days`` of ``healthy_days``). This fault is the one the stuck-feature rule
  was written for: detection on day 1 is true by construction, so it is a check, not the measure;
* ``degradations``: the measure. Faults the rules were not written for (:mod:`pipeline.bench.degradations`:
  a fraud pattern absent from training, an outage of one feature for one channel's payments, one
  acquirer's amounts in minor units), each from the live week's 3rd day, served to the champion
  and judged as above: ``days_to_detection`` (1: the first affected day, judged when its labels
  matured) and the rules that fired (``detected_by``); days called degraded before the fault began
  are false alarms too. The healthy week recomputed through the same feature kernel
  (``recomputed_control_false_alarm_days``) shows the recomputation alone raises nothing. A preset
  that simulates every pattern (highrisk) gets its new pattern from a second portfolio, the preset
  without its smallest pattern, and a second model trained on it (the detail names that portfolio):
  one more portfolio build and training run for that preset.

``$FRAUD_BENCH_DECISIONS_PRESETS`` (comma-separated, e.g. ``ecommerce,highrisk``) narrows a run to those
presets; the result records which ran.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.atomic import write_json_atomic
from pipeline.backtest import score_frame
from pipeline.bench import RESULTS_DIR
from pipeline.bench.baseline import fit_lightgbm, lightgbm_predict, train_ours
from pipeline.bench.dataset import FULL, PRESETS, QUICK, SIM_DAYS, BenchPortfolio, bench_portfolio
from pipeline.bench.degradations import (
    Degradation,
    LiveWeek,
    absent_pattern,
    acquirer_minor_units,
    channel_outage,
    new_fraud_pattern,
    recomputed,
    withheld_pattern,
)
from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    DecisionBudget,
    OperatingPoints,
    choose_operating_points,
    read_operating_points,
    split_figures,
)
from pipeline.decisions.review_tracking import ReviewThresholdTracker, ReviewTrackingConfig
from pipeline.ingest.config import load_ingest_config
from pipeline.metrics import precision_at_rate, recall_at_rate
from pipeline.monitoring.config import MonitoringConfig, load_monitoring_config
from pipeline.monitoring.drift import broken_inputs, feature_psi, out_of_range_features
from pipeline.monitoring.figures import RankingExpectation, day_ranking, ranking_expectation
from pipeline.monitoring.history import (
    MonitoredDay,
    days_below_in_a_row,
    degraded_by,
    judge_day,
    version_state,
)
from pipeline.monitoring.missed_frauds import MissedFraudReference, missed_fraud_reference, missed_frauds
from pipeline.paths import state_dir
from pipeline.serving.config import DecisionConfig, load_serving_config
from pipeline.simulation.windows import Window, labels_published_on, simulate_window
from pipeline.training.config import load_train_config
from pipeline.training.run_dir import RunDir

SEED = 1
STUCK_CANDIDATE_ROWS = 40_000  # validation rows each candidate stuck feature is scored on
DETECTION_DAYS_GOAL = 3  # a degradation is reported degraded within this many days of its first labels maturing
FALSE_ALARM_DAYS_GOAL = 1  # days of the healthy week reported degraded, at most
SERVED_BATCH = 64  # payments decided at one threshold (a /score/batch call, or the feed's batch)
PRESETS_ENV = "FRAUD_BENCH_DECISIONS_PRESETS"  # comma-separated presets to run (all when unset)


def selected_presets(value: str | None) -> tuple[str, ...]:
    """The presets ``$FRAUD_BENCH_DECISIONS_PRESETS`` names, in :data:`PRESETS` order (all when unset or
    empty). Raises ValueError naming an unknown preset."""
    names = {n.strip() for n in (value or "").split(",") if n.strip()}
    unknown = sorted(names - set(PRESETS))
    if unknown:
        raise ValueError(f"${PRESETS_ENV} names unknown presets {', '.join(unknown)}: choose from {', '.join(PRESETS)}")
    return tuple(p for p in PRESETS if not names or p in names)


def _relative_change(before: float, after: float) -> float | None:
    return abs(after - before) / before if before > 0 else None


def _at_budget(labels: np.ndarray, scores: np.ndarray, points: OperatingPoints, budget: DecisionBudget) -> dict[str, Any]:
    own = split_figures(labels, scores, points.review_threshold, points.block_threshold)
    return {"recall_at_budget": recall_at_rate(labels, scores, budget.review_rate),
            "precision_at_budget": precision_at_rate(labels, scores, budget.review_rate),
            "review_threshold": points.review_threshold, "block_threshold": points.block_threshold,
            "block_rule": points.block_rule, "realised_review_rate": own.review_rate,
            "realised_block_rate": own.block_rate, "recall_at_own_thresholds": own.recall,
            "precision_at_own_thresholds": own.precision, "validation": vars(points.validation)}


def _served_flags(frame: pd.DataFrame, scores: np.ndarray, points: OperatingPoints,
                  tracking: ReviewTrackingConfig) -> tuple[np.ndarray, dict[str, Any]]:
    """The test week as the service decides it: event-time order, batches of ``SERVED_BATCH`` decided at
    the tracked review threshold, each batch observed after it was decided. The flags (in ``frame``'s
    order) and what the tracker did."""
    order = np.argsort(frame["event_time"].to_numpy(), kind="stable")
    ordered = scores[order]
    tracker = ReviewThresholdTracker(points.budget.review_rate, points.review_threshold, points.block_threshold,
                                     tracking)
    flagged = np.zeros(ordered.size, dtype=bool)
    for start in range(0, ordered.size, SERVED_BATCH):
        batch = ordered[start:start + SERVED_BATCH]
        flagged[order[start:start + batch.size]] = batch >= tracker.threshold
        tracker.observe(batch)
    return flagged, tracker.describe()


def _served(frame: pd.DataFrame, scores: np.ndarray, points: OperatingPoints,
            tracking: ReviewTrackingConfig) -> dict[str, Any]:
    flagged, tracking_state = _served_flags(frame, scores, points, tracking)
    days = pd.to_datetime(frame["event_time"], utc=True).dt.date.to_numpy()
    daily = {day.isoformat(): float(flagged[days == day].mean()) for day in sorted(set(days))}
    return {"review_rate": float(flagged.mean()), "daily_review_rates": daily, "tracking": tracking_state}


def _stuck_feature(run: RunDir, validation: pd.DataFrame, train: pd.DataFrame, features: tuple[str, ...],
                   budget: DecisionBudget) -> tuple[str, float]:
    """The numeric feature whose value stuck at its training median lowers validation recall at the
    budget most: recall as served, where the review threshold follows the scores to the budget, so a
    feature that only shifts every score is absorbed and one that spoils the ranking is not."""
    sample = validation.sample(min(len(validation), STUCK_CANDIDATE_ROWS), random_state=SEED)
    labels = sample["label"].to_numpy()
    recalls = {}
    for name in features:
        stuck = sample.assign(**{name: float(train[name].median())})
        recalls[name] = recall_at_rate(labels, score_frame(run, stuck), budget.review_rate)
    worst = min(recalls, key=recalls.get)
    return worst, float(train[worst].median())


@dataclass(frozen=True)
class _ValidationReference:
    """What the live monitor reads from a version's validation scores (pipeline.monitoring.sources)."""

    ranking: RankingExpectation | None
    missed: MissedFraudReference


def _monitored_days(frame: pd.DataFrame, scores: np.ndarray, flagged: np.ndarray, expected: float,
                    validation: _ValidationReference, config: MonitoringConfig, training: dict[str, np.ndarray],
                    categorical: set[str]) -> list[dict[str, Any]]:
    """The monitor's judgement of each test day, in order (its per-version history as it accumulates),
    of the payments as they were scored and flagged when served, their served features against
    ``training``: the state and the rules behind a ``degraded`` one (:func:`degraded_by`)."""
    days = pd.to_datetime(frame["event_time"], utc=True).dt.date.to_numpy()
    labels = frame["label"].to_numpy().astype(bool)
    history: list[MonitoredDay] = []
    out = []
    for day in sorted(set(days)):
        rows = days == day
        frauds = int(labels[rows].sum())
        recall = float((flagged[rows] & labels[rows]).sum() / frauds) if frauds else None
        served = {n: frame.loc[rows, n].to_numpy(np.float64) for n in training}
        drift = feature_psi(training, served, categorical, config.feature_bins)
        cards = frame.loc[rows, "card_id"].to_numpy()
        expected_ranking = validation.ranking
        ranking = day_ranking(labels[rows], scores[rows], cards, expected_ranking, config.confidence)
        missed = missed_frauds(labels[rows], flagged[rows], cards, validation.missed, config.confidence)
        entry = judge_day(day, frauds, recall, expected, config,
                          broken_inputs(training, served, config.stuck_feature_share, config.segment_features,
                                        config.segment_kept),
                          out_of_range_features(training, served, config.range_features, config.out_of_range_share),
                          ranking, expected_ranking.auc if expected_ranking else None, missed)
        history.append(entry)
        streak = days_below_in_a_row(history, day)
        top = max(drift, key=drift.get)
        out.append({"date": day.isoformat(), "frauds": frauds, "recall": recall, "recall_upper": entry.recall_upper,
                    "auc": entry.auc, "auc_upper": entry.auc_upper, "auc_floor": entry.auc_floor,
                    "missed_fraud_cards": entry.missed_fraud_cards, "missed_fraud_ratio": entry.missed_fraud_ratio,
                    "missed_fraud_ratio_lower": entry.missed_fraud_ratio_lower,
                    "review_rate": float(flagged[rows].mean()), "broken_features": list(entry.broken_features),
                    "out_of_range_features": list(entry.out_of_range_features),
                    "feature_psi_max": [top, drift[top]], "state": version_state(entry, streak, config),
                    "degraded_by": list(degraded_by(entry, streak, config))})
    return out


def _first_degraded(days: list[dict[str, Any]]) -> int | None:
    return next((i + 1 for i, d in enumerate(days) if d["state"] == "degraded"), None)


def _live_week(portfolio: BenchPortfolio, quick: bool, served: pd.DataFrame) -> LiveWeek | None:
    """The portfolio's test week and the window the simulator made for it (simulated again: the same
    config gives the same payments, checked against the portfolio's truth); None for an external
    dataset, which has no simulator behind it."""
    if portfolio.truth is None or portfolio.simulation is None:
        return None
    base = portfolio.simulation
    size = QUICK if quick else FULL
    window = Window(0, date.fromisoformat(base.start_date), SIM_DAYS)
    sim = simulate_window(window, base, num_cards=size.num_cards, num_merchants=size.num_merchants)
    if not sim.truth["transaction_id"].reset_index(drop=True).equals(
            portfolio.truth["transaction_id"].reset_index(drop=True)):
        raise RuntimeError(f"simulating the {portfolio.name} portfolio again gave other payments than its cached "
                           f"truth ({portfolio.source}): delete that directory to rebuild it")
    return LiveWeek(served, sim.transactions, labels_published_on(window, None, [sim]), sim.truth, sim.config,
                    window.cutoff, load_ingest_config("dev").features)


def _detection(degradation: Degradation, days: list[dict[str, Any]], flagged: np.ndarray) -> dict[str, Any]:
    """Days to detection of ``degradation`` from the monitor's judgement of its ``days``: 1 = the first
    affected day itself. Each day is judged once its labels have matured (the nightly monitor's
    rule), so for a label-free rule and a label-based one alike this counts days from the first
    affected day's maturity; a day reported degraded before the fault began is a false alarm."""
    onset = degradation.first_affected_day.isoformat()
    start = next(i for i, d in enumerate(days) if d["date"] >= onset)
    detected = next((i for i in range(start, len(days)) if days[i]["state"] == "degraded"), None)
    frame, affected = degradation.frame, degradation.affected
    labels = frame["label"].to_numpy().astype(bool)
    after = pd.to_datetime(frame["event_time"], utc=True).dt.date.to_numpy() >= degradation.first_affected_day

    def recall(rows: np.ndarray) -> float | None:
        frauds = labels & rows & after
        return float((flagged & frauds).sum() / frauds.sum()) if frauds.any() else None

    return {"name": degradation.name, "description": degradation.description, "first_affected_day": onset,
            "detected_day": days[detected]["date"] if detected is not None else None,
            "days_to_detection": detected - start + 1 if detected is not None else None,
            "detected_by": days[detected]["degraded_by"] if detected is not None else [],
            "first_matured_day": next((d["date"] for d in days[start:] if d["state"] != "insufficient_evidence"), None),
            "false_alarm_days_before_onset": sum(d["state"] == "degraded" for d in days[:start]),
            "affected_rows_from_onset": int((affected & after).sum()), "rows_from_onset": int(after.sum()),
            "recall_on_affected_frauds": recall(affected), "recall_on_other_frauds": recall(~affected),
            "detail": degradation.detail, "days": days}


def _degradations(week: LiveWeek | None, stuck: tuple[str, float], judge, withheld=None) -> dict[str, Any]:
    """Each degradation of :mod:`pipeline.bench.degradations` served and judged by ``judge`` (frame ->
    (days, flags)), and the healthy week recomputed through the same feature kernel (a control: the
    injections, not the recomputation, must be what the monitor sees). ``withheld``: for a preset
    that simulates every pattern, the new pattern's fault and its own judge (a model trained without
    that pattern, :func:`_withheld_pattern_fault`)."""
    if week is None:
        return {"skipped": ["all: an external dataset has no simulated window to inject faults into"],
                "degradations": []}
    control_days, _ = judge(recomputed(week, week.transactions, week.reports))
    new_pattern = new_fraud_pattern(week)
    faults = [(channel_outage(week, *stuck), judge), (acquirer_minor_units(week), judge)]
    if new_pattern is not None or withheld is not None:
        faults.insert(0, (new_pattern, judge) if new_pattern is not None else withheld)
    skipped = [] if len(faults) == 3 else ["new_fraud_pattern: the preset simulates every fraud pattern"]
    return {"degradations": [_detection(fault, *judged(fault.frame)) for fault, judged in faults], "skipped": skipped,
            "recomputed_control_false_alarm_days": sum(d["state"] == "degraded" for d in control_days)}


@dataclass(frozen=True)
class _Scored:
    """Both models trained on a portfolio, with their operating points and holdout scores."""

    run: RunDir  # ours
    ours_points: OperatingPoints
    ours: np.ndarray
    gbm_points: OperatingPoints
    gbm: np.ndarray


@dataclass(frozen=True)
class _Monitored:
    """The monitor's judgement of ours on the holdout, healthy and with one feature stuck."""

    stuck: tuple[str, float]  # the feature stuck at its training median, and that median
    days: list[dict[str, Any]]  # each day with the feature stuck
    healthy_days: list[dict[str, Any]]
    first_matured_day: int | None  # the first stuck day past insufficient evidence (1-based)
    injected: dict[str, Any]  # the injected degradations (:func:`_degradations`)


def run_portfolio(portfolio: BenchPortfolio, quick: bool, workdir: Path, budget: DecisionBudget,
                  monitoring: MonitoringConfig, decision: DecisionConfig) -> dict[str, Any]:
    """One portfolio's figures: both models at the budget (fixed thresholds, as served, absolute
    thresholds), and the monitor against a stuck feature and the injected degradations."""
    holdout = portfolio.data.holdout
    splits = {name: read_split(portfolio.data.root, holdout.manifest, name) for name in ("train", "validation")}
    scored = _score_both(portfolio, splits, workdir, budget, quick)
    models, served = _at_budget_both(holdout.frame, holdout.labels, scored, budget, decision.review_tracking)
    absolute = (decision.review_threshold, decision.block_threshold)
    flagged_abs = {name: float(np.mean(s >= absolute[0])) for name, s in (("ours", scored.ours), ("lightgbm", scored.gbm))}
    monitored = _monitored(portfolio, splits, scored, budget, monitoring, decision.review_tracking, quick, workdir)
    (stuck_name, stuck_value), healthy_days = monitored.stuck, monitored.healthy_days
    return {
        "name": portfolio.name, "source": portfolio.source, "rows": int(len(holdout.frame)),
        "frauds": int(holdout.labels.sum()), "test_week": [holdout.window.start, holdout.window.end],
        "review_budget": budget.review_rate,
        "realised_review_rate": served["ours"]["review_rate"],
        "realised_review_rate_vs_budget": served["ours"]["review_rate"] / budget.review_rate,
        "realised_review_rate_fixed_threshold": models["ours"]["realised_review_rate"],
        "review_tracking": vars(decision.review_tracking),
        "recall_at_budget": {k: v["recall_at_budget"] for k, v in models.items()},
        "precision_at_budget": {k: v["precision_at_budget"] for k, v in models.items()},
        "models": models,
        "swap_review_rate_change": _relative_change(served["ours"]["review_rate"], served["lightgbm"]["review_rate"]),
        "swap_review_rate_change_fixed_thresholds": _relative_change(models["ours"]["realised_review_rate"],
                                                                     models["lightgbm"]["realised_review_rate"]),
        "swap_review_rate_change_absolute_thresholds": _relative_change(flagged_abs["ours"], flagged_abs["lightgbm"]),
        "absolute_thresholds": {"review_threshold": absolute[0], "block_threshold": absolute[1],
                                "flagged_share": flagged_abs},
        "degradation": {"kind": f"feature {stuck_name} stuck at its training median {stuck_value:.6g} in serving "
                                "(decided as served: the review threshold tracked on the stuck scores)",
                        "expected_recall": scored.ours_points.validation.recall,
                        "recall_margin": monitoring.recall_margin,
                        "confidence": monitoring.confidence, "stuck_feature_share": monitoring.stuck_feature_share,
                        "degraded_after_days": monitoring.degraded_after_days, "min_frauds": monitoring.min_frauds,
                        "days": monitored.days, "healthy_days": healthy_days},
        "detected_after_days": _first_degraded(monitored.days),
        "first_matured_day": monitored.first_matured_day,
        "false_alarm_days": sum(d["state"] == "degraded" for d in healthy_days),
        "healthy_days": len(healthy_days),
        **monitored.injected,
    }


def _score_both(portfolio: BenchPortfolio, splits: dict[str, pd.DataFrame], workdir: Path, budget: DecisionBudget,
                quick: bool) -> _Scored:
    """Train ours (its operating points are the run's) and fit LightGBM (operating points of ``budget``
    chosen on its validation scores, as ours are); score the holdout with both."""
    holdout, manifest = portfolio.data.holdout, portfolio.data.holdout.manifest
    run, _ = train_ours(portfolio, workdir, SEED, quick)
    ours_points = read_operating_points(run.model)
    ours = score_frame(run, holdout.frame)
    booster = fit_lightgbm(manifest, splits, SEED, quick)
    gbm_points = choose_operating_points(splits["validation"][manifest.label_column].to_numpy(),
                                         lightgbm_predict(booster, manifest, splits["validation"]), budget)
    return _Scored(run, ours_points, ours, gbm_points, lightgbm_predict(booster, manifest, holdout.frame))


def _at_budget_both(frame: pd.DataFrame, labels: np.ndarray, scored: _Scored, budget: DecisionBudget,
                    tracking: ReviewTrackingConfig) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(models, served)``: each model's figures at the budget on the holdout with its fixed
    thresholds (``served`` included under "served"), and as the service decides it (tracked threshold)."""
    models = {"ours": _at_budget(labels, scored.ours, scored.ours_points, budget),
              "lightgbm": _at_budget(labels, scored.gbm, scored.gbm_points, budget)}
    served = {"ours": _served(frame, scored.ours, scored.ours_points, tracking),
              "lightgbm": _served(frame, scored.gbm, scored.gbm_points, tracking)}
    for name, figures in served.items():
        models[name]["served"] = figures
    return models, served


def _monitored(portfolio: BenchPortfolio, splits: dict[str, pd.DataFrame], scored: _Scored, budget: DecisionBudget,
               monitoring: MonitoringConfig, tracking: ReviewTrackingConfig, quick: bool, workdir: Path) -> _Monitored:
    """The monitor on ours, day by day: the healthy holdout, the holdout with the numeric feature
    whose stuck value hurts recall most stuck at its training median, and the injected degradations."""
    holdout, manifest, run = portfolio.data.holdout, portfolio.data.holdout.manifest, scored.run
    expected = scored.ours_points.validation.recall
    stuck_name, stuck_value = _stuck_feature(run, splits["validation"], splits["train"],
                                             tuple(manifest.numeric_features), budget)
    stuck_scores = score_frame(run, holdout.frame.assign(**{stuck_name: stuck_value}))
    frame = holdout.frame.assign(label=holdout.labels)
    training = _training_sample(splits["train"], manifest, monitoring)
    categorical = set(manifest.categorical_features)
    validation = _validation_reference(run, splits["validation"], manifest, scored.ours_points)
    healthy_days = _monitored_days(frame, scored.ours, _served_flags(frame, scored.ours, scored.ours_points, tracking)[0],
                                   expected, validation, monitoring, training, categorical)
    degraded_days = _monitored_days(frame.assign(**{stuck_name: stuck_value}), stuck_scores,
                                    _served_flags(frame, stuck_scores, scored.ours_points, tracking)[0], expected,
                                    validation, monitoring, training, categorical)
    first_matured = next((i + 1 for i, d in enumerate(degraded_days) if d["state"] != "insufficient_evidence"), None)
    judge = _judge(run, scored.ours_points, validation, training, categorical, monitoring, tracking)
    week = _live_week(portfolio, quick, frame)
    withheld = (_withheld_pattern_fault(portfolio, quick, workdir, monitoring, tracking)
                if week is not None and absent_pattern(week.config) is None else None)
    injected = _degradations(week, (stuck_name, stuck_value), judge, withheld)
    return _Monitored((stuck_name, stuck_value), degraded_days, healthy_days, first_matured, injected)


def _training_sample(train: pd.DataFrame, manifest, monitoring: MonitoringConfig) -> dict[str, np.ndarray]:
    """The monitor's reference: a seeded sample of the train split's model inputs."""
    sample = train.sample(min(len(train), monitoring.feature_sample_rows), random_state=SEED)
    return {n: sample[n].to_numpy(np.float64) for n in [*manifest.numeric_features, *manifest.categorical_features]}


def _validation_reference(run: RunDir, validation: pd.DataFrame, manifest,
                          points: OperatingPoints) -> _ValidationReference:
    """What the monitor expects a day's ranking of its frauds to reach (the version's validation split's
    AUC and the spread of its days, :func:`ranking_expectation`) and the fraud cards validation let past
    its review threshold (:func:`missed_fraud_reference`), as the live monitor reads them."""
    columns = (validation[manifest.label_column].to_numpy(), score_frame(run, validation),
               validation["event_time"].to_numpy(), validation["card_id"].to_numpy())
    return _ValidationReference(ranking_expectation(*columns),
                                missed_fraud_reference(*columns, points.review_threshold))


def _judge(run: RunDir, points: OperatingPoints, validation: _ValidationReference,
           training: dict[str, np.ndarray],
           categorical: set[str], monitoring: MonitoringConfig, tracking: ReviewTrackingConfig):
    """The monitor's day-by-day judgement of ``run`` serving a frame: frame -> (days, flags as served)."""
    def judge(served_frame: pd.DataFrame) -> tuple[list[dict[str, Any]], np.ndarray]:
        scores = score_frame(run, served_frame)
        flags = _served_flags(served_frame, scores, points, tracking)[0]
        days = _monitored_days(served_frame, scores, flags, points.validation.recall, validation, monitoring,
                               training, categorical)
        return days, flags
    return judge


def _withheld_pattern_fault(portfolio: BenchPortfolio, quick: bool, workdir: Path, monitoring: MonitoringConfig,
                            tracking: ReviewTrackingConfig) -> tuple[Degradation, Any]:
    """A new fraud pattern for a preset that simulates them all: the preset's portfolio without the
    :func:`withheld_pattern` (built and cached like the others), our model trained on it by the same
    job, and the pattern injected into that portfolio's live week; with that model's judge."""
    pattern = withheld_pattern(portfolio.simulation)
    variant = bench_portfolio(quick, portfolio.name, withheld=pattern)
    holdout, manifest = variant.data.holdout, variant.data.holdout.manifest
    run, _ = train_ours(variant, workdir, SEED, quick)
    splits = {name: read_split(variant.data.root, manifest, name) for name in ("train", "validation")}
    training = _training_sample(splits["train"], manifest, monitoring)
    week = _live_week(variant, quick, holdout.frame.assign(label=holdout.labels))
    fault = new_fraud_pattern(week)
    fault = dataclasses.replace(fault, detail={**fault.detail, "withheld_from_training": variant.source})
    points = read_operating_points(run.model)
    return fault, _judge(run, points, _validation_reference(run, splits["validation"], manifest, points),
                         training, set(manifest.categorical_features), monitoring, tracking)


def _degradation_goals(d: dict[str, Any]) -> dict[str, bool]:
    goals = {f"{g['name']}_detected_within_{DETECTION_DAYS_GOAL}_days": (
        g["days_to_detection"] is not None and g["days_to_detection"] <= DETECTION_DAYS_GOAL
        and g["false_alarm_days_before_onset"] == 0) for g in d.get("degradations", [])}
    goals[f"false_alarm_days_at_most_{FALSE_ALARM_DAYS_GOAL}"] = d["false_alarm_days"] <= FALSE_ALARM_DAYS_GOAL
    return goals


def run(quick: bool) -> dict[str, Any]:
    budget = load_train_config("dev").decisions
    monitoring = load_monitoring_config("dev")
    decision = load_serving_config("dev").decision
    datasets = []
    presets = selected_presets(os.environ.get(PRESETS_ENV))
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        for preset in presets:
            datasets.append(run_portfolio(bench_portfolio(quick, preset), quick, Path(tmp), budget, monitoring,
                                          decision))
            write_json_atomic(RESULTS_DIR / "decisions.partial.json", {"datasets": datasets}, durable=False)
    goals = {d["name"]: {
        "realised_review_rate_within_20pct": abs(d["realised_review_rate_vs_budget"] - 1) <= 0.2,
        "recall_at_budget_at_least_lightgbm": d["recall_at_budget"]["ours"] >= d["recall_at_budget"]["lightgbm"],
        "precision_at_budget_at_least_lightgbm": d["precision_at_budget"]["ours"] >= d["precision_at_budget"]["lightgbm"],
        "swap_review_rate_change_at_most_0.2": (d["swap_review_rate_change"] is not None
                                                and d["swap_review_rate_change"] <= 0.2),
        "detected_on_the_first_matured_day": (d["detected_after_days"] is not None
                                              and d["detected_after_days"] == d["first_matured_day"]),
        **_degradation_goals(d),
    } for d in datasets}
    return {"goal": "per portfolio: realised review rate within +-20% of the budget; recall and precision at the "
                    "budget >= LightGBM's; review rate change at a swap <= 0.2; a stuck feature reported degraded "
                    "on the first monitored day with matured labels; each degradation detected within "
                    f"{DETECTION_DAYS_GOAL} days of its labels maturing, at most {FALSE_ALARM_DAYS_GOAL} "
                    "false-alarm day in the 7 healthy days",
            "seed": SEED, "presets": list(presets), "budget": vars(budget), "datasets": datasets, "goal_met": goals}
