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
  the operating points against the expectation, and served features against a training sample,
  ``stuck_feature_share``): the first test day reported ``degraded``; the healthy champion's days
  beside it (false alarms).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.atomic import write_json_atomic
from pipeline.backtest import score_frame
from pipeline.bench import RESULTS_DIR
from pipeline.bench.baseline import fit_lightgbm, lightgbm_predict, train_ours
from pipeline.bench.dataset import PRESETS, BenchPortfolio, bench_portfolio
from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    DecisionBudget,
    OperatingPoints,
    choose_operating_points,
    read_operating_points,
    split_figures,
)
from pipeline.decisions.review_tracking import ReviewThresholdTracker, ReviewTrackingConfig
from pipeline.metrics import precision_at_rate, recall_at_rate
from pipeline.monitoring.config import MonitoringConfig, load_monitoring_config
from pipeline.monitoring.drift import feature_psi, stuck_features
from pipeline.monitoring.history import (
    MonitoredDay,
    days_below_in_a_row,
    judge_day,
    version_state,
)
from pipeline.paths import state_dir
from pipeline.serving.config import DecisionConfig, load_serving_config
from pipeline.training.config import load_train_config
from pipeline.training.run_dir import RunDir

SEED = 1
STUCK_CANDIDATE_ROWS = 40_000  # validation rows each candidate stuck feature is scored on
SERVED_BATCH = 64  # payments decided at one threshold (a /score/batch call, or the feed's batch)


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


def _monitored_days(frame: pd.DataFrame, flagged: np.ndarray, expected: float, config: MonitoringConfig,
                    training: dict[str, np.ndarray], categorical: set[str]) -> list[dict[str, Any]]:
    """The monitor's judgement of each test day, in order (its per-version history as it accumulates),
    of the payments as they were flagged when served, their served features against ``training``."""
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
        entry = judge_day(day, frauds, recall, expected, config,
                          stuck_features(training, served, config.stuck_feature_share))
        history.append(entry)
        state = version_state(entry, days_below_in_a_row(history, day), config)
        top = max(drift, key=drift.get)
        out.append({"date": day.isoformat(), "frauds": frauds, "recall": recall, "recall_upper": entry.recall_upper,
                    "review_rate": float(flagged[rows].mean()), "broken_features": list(entry.broken_features),
                    "feature_psi_max": [top, drift[top]], "state": state})
    return out


def _first_degraded(days: list[dict[str, Any]]) -> int | None:
    return next((i + 1 for i, d in enumerate(days) if d["state"] == "degraded"), None)


def run_portfolio(portfolio: BenchPortfolio, quick: bool, workdir: Path, budget: DecisionBudget,
                  monitoring: MonitoringConfig, decision: DecisionConfig) -> dict[str, Any]:
    holdout = portfolio.data.holdout
    manifest = holdout.manifest
    splits = {name: read_split(portfolio.data.root, manifest, name) for name in ("train", "validation")}
    labels = holdout.labels
    run, _ = train_ours(portfolio, workdir, SEED, quick)
    ours_points = read_operating_points(run.model)
    ours = score_frame(run, holdout.frame)
    booster = fit_lightgbm(manifest, splits, SEED, quick)
    gbm_points = choose_operating_points(splits["validation"][manifest.label_column].to_numpy(),
                                         lightgbm_predict(booster, manifest, splits["validation"]), budget)
    gbm = lightgbm_predict(booster, manifest, holdout.frame)
    models = {"ours": _at_budget(labels, ours, ours_points, budget),
              "lightgbm": _at_budget(labels, gbm, gbm_points, budget)}
    served = {"ours": _served(holdout.frame, ours, ours_points, decision.review_tracking),
              "lightgbm": _served(holdout.frame, gbm, gbm_points, decision.review_tracking)}
    for name, figures in served.items():
        models[name]["served"] = figures
    absolute = (decision.review_threshold, decision.block_threshold)
    flagged_abs = {name: float(np.mean(s >= absolute[0])) for name, s in (("ours", ours), ("lightgbm", gbm))}

    expected = ours_points.validation.recall
    stuck_name, stuck_value = _stuck_feature(run, splits["validation"], splits["train"],
                                             tuple(manifest.numeric_features), budget)
    stuck_scores = score_frame(run, holdout.frame.assign(**{stuck_name: stuck_value}))
    frame = holdout.frame.assign(label=labels)
    tracking = decision.review_tracking
    sample = splits["train"].sample(min(len(splits["train"]), monitoring.feature_sample_rows), random_state=SEED)
    columns = [*manifest.numeric_features, *manifest.categorical_features]
    training = {n: sample[n].to_numpy(np.float64) for n in columns}
    categorical = set(manifest.categorical_features)
    healthy_days = _monitored_days(frame, _served_flags(frame, ours, ours_points, tracking)[0], expected, monitoring,
                                   training, categorical)
    degraded_days = _monitored_days(frame.assign(**{stuck_name: stuck_value}),
                                    _served_flags(frame, stuck_scores, ours_points, tracking)[0], expected,
                                    monitoring, training, categorical)
    first_matured = next((i + 1 for i, d in enumerate(degraded_days) if d["state"] != "insufficient_evidence"), None)
    return {
        "name": portfolio.name, "source": portfolio.source, "rows": int(len(holdout.frame)),
        "frauds": int(labels.sum()), "test_week": [holdout.window.start, holdout.window.end],
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
                        "expected_recall": expected, "recall_margin": monitoring.recall_margin,
                        "confidence": monitoring.confidence, "stuck_feature_share": monitoring.stuck_feature_share,
                        "degraded_after_days": monitoring.degraded_after_days, "min_frauds": monitoring.min_frauds,
                        "days": degraded_days, "healthy_days": healthy_days},
        "detected_after_days": _first_degraded(degraded_days),
        "first_matured_day": first_matured,
        "false_alarm_days": sum(d["state"] == "degraded" for d in healthy_days),
    }


def run(quick: bool) -> dict[str, Any]:
    budget = load_train_config("dev").decisions
    monitoring = load_monitoring_config("dev")
    decision = load_serving_config("dev").decision
    datasets = []
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        for preset in PRESETS:
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
    } for d in datasets}
    return {"goal": "per portfolio: realised review rate within +-20% of the budget; recall and precision at the "
                    "budget >= LightGBM's; review rate change at a swap <= 0.2; a stuck feature reported degraded "
                    "on the first monitored day with matured labels",
            "seed": SEED, "budget": vars(budget), "datasets": datasets, "goal_met": goals}
