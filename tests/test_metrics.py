"""Metric implementations against hand-computed values."""

from __future__ import annotations

import math

import numpy as np

from pipeline.metrics import (
    auc_roc,
    average_precision,
    card_precision_at_k,
    classification_report,
    expected_calibration_error,
    population_stability_index,
    recall_at_fpr,
)


def test_auc_and_ap_on_a_hand_checked_ranking():
    labels = [1, 0, 1, 0]
    scores = [0.9, 0.8, 0.7, 0.1]
    assert auc_roc(labels, scores) == 0.75  # 3 of 4 (pos, neg) pairs ordered correctly
    assert average_precision(labels, scores) == (1.0 + 2 / 3) / 2


def test_degenerate_inputs_give_nan_not_errors():
    assert math.isnan(auc_roc([0, 0], [0.1, 0.2]))
    assert math.isnan(average_precision([], []))
    assert math.isnan(recall_at_fpr([1, 1], [0.1, 0.2]))


def test_recall_at_fpr_takes_the_best_threshold_within_budget():
    # 100 negatives; 1 negative outranks everything, positives are next: at FPR<=1% all 3 positives are found.
    labels = np.array([0] + [1, 1, 1] + [0] * 99)
    scores = np.array([1.0, 0.9, 0.8, 0.7] + [0.1] * 99)
    assert recall_at_fpr(labels, scores, 0.01) == 1.0
    assert recall_at_fpr(labels, scores, 0.0) == 0.0


def test_card_precision_groups_by_card_and_day():
    # Day 1: card a (fraud) top, card b genuine; day 2: card c genuine top, d fraud second.
    labels = [1, 0, 0, 0, 1]
    scores = [0.9, 0.1, 0.8, 0.95, 0.5]
    cards = ["a", "a", "b", "c", "d"]
    days = [1, 1, 1, 2, 2]
    assert card_precision_at_k(labels, scores, cards, days, k=1) == (1.0 + 0.0) / 2
    assert card_precision_at_k(labels, scores, cards, days, k=2) == (0.5 + 0.5) / 2


def test_ece_is_zero_when_calibrated_and_large_when_not():
    labels = np.array([0, 0, 1, 1])
    assert expected_calibration_error(labels, np.array([0.0, 0.0, 0.99, 0.99]), bins=10) < 0.011
    assert expected_calibration_error(labels, np.array([0.99, 0.99, 0.0, 0.0]), bins=10) > 0.98


def test_psi_zero_for_same_distribution_and_grows_with_shift():
    rng = np.random.default_rng(0)
    ref = rng.random(20_000)
    assert population_stability_index(ref, rng.random(20_000)) < 0.01
    assert population_stability_index(ref, rng.random(20_000) ** 3) > 0.5


def test_report_carries_counts():
    report = classification_report([1, 0, 0, 1], [0.9, 0.2, 0.3, 0.6], ["a", "b", "c", "d"], [1, 1, 1, 1])
    assert report["n"] == 4 and report["n_fraud"] == 2 and report["auc_roc"] == 1.0
    assert report["card_precision_at_100"] == 2 / 100
