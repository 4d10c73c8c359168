"""The paired comparison of challenger and champion: which rows enter, which unit is resampled,
determinism, and storage."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.evaluation.comparison import Comparison, budget_metrics, compare_models
from pipeline.evaluation.config import IntervalConfig
from pipeline.metrics import (
    auc_roc,
    average_precision,
    paired_bootstrap_difference,
    precision_at_rate,
    recall_at_rate,
)

SETTINGS = IntervalConfig(confidence=0.9, bootstrap_resamples=200, seed=5)
BUDGET = 0.05  # 100 of the 2,000 rows


@pytest.fixture(scope="module")
def scored():
    rng = np.random.default_rng(0)
    cards = np.array([f"card-{c:03d}" for c in rng.integers(0, 300, 2000)])
    labels = (rng.random(2000) < 0.06).astype(np.int64)
    champion = 1 / (1 + np.exp(-(rng.normal(-3, 1, 2000) + 2 * labels)))
    challenger = 1 / (1 + np.exp(-(rng.normal(-3, 1, 2000) + 2.5 * labels)))
    return labels, challenger, champion, cards


def test_differences_are_challenger_minus_champion_by_card(scored):
    labels, challenger, champion, cards = scored
    result = compare_models(labels, challenger, champion, cards, SETTINGS, review_rate=BUDGET)
    assert result.auc_roc.estimate == pytest.approx(auc_roc(labels, challenger) - auc_roc(labels, champion))
    assert result.average_precision.estimate == pytest.approx(
        average_precision(labels, challenger) - average_precision(labels, champion))
    assert (result.auc_roc.method, result.average_precision.method) == ("delong-clustered", "bootstrap-clustered")
    assert result.auc_roc.units == result.average_precision.units == len(set(cards))
    assert result.auc_roc.confidence == 0.9
    assert (result.n, result.n_fraud) == (2000, labels.sum())


def test_budget_differences_flag_the_same_share_of_the_same_rows_by_card(scored):
    labels, challenger, champion, cards = scored
    result = compare_models(labels, challenger, champion, cards, SETTINGS, review_rate=BUDGET)
    assert result.review_budget == BUDGET
    assert result.recall_at_budget.estimate == pytest.approx(
        recall_at_rate(labels, challenger, BUDGET) - recall_at_rate(labels, champion, BUDGET))
    assert result.precision_at_budget.estimate == pytest.approx(
        precision_at_rate(labels, challenger, BUDGET) - precision_at_rate(labels, champion, BUDGET))
    # The interval is the card bootstrap of the gate's settings on exactly these rows.
    alone = paired_bootstrap_difference(labels, challenger, champion, "recall_at_rate", clusters=cards,
                                        resamples=200, confidence=0.9, seed=5, rate=BUDGET)
    assert result.recall_at_budget == alone and alone.method == "bootstrap-clustered"
    assert result.recall_at_budget.lower < result.recall_at_budget.estimate < result.recall_at_budget.upper
    other_budget = compare_models(labels, challenger, champion, cards, SETTINGS, review_rate=0.2)
    assert other_budget.recall_at_budget.estimate != result.recall_at_budget.estimate
    assert other_budget.auc_roc == result.auc_roc and other_budget.average_precision == result.average_precision


def test_each_models_budget_metrics_are_on_the_rows_it_scored(scored):
    labels, challenger, _, _ = scored
    broken = challenger.copy()
    broken[:100] = np.nan
    figures = budget_metrics(labels, broken, BUDGET)
    assert figures == {"recall_at_budget": recall_at_rate(labels[100:], challenger[100:], BUDGET),
                       "precision_at_budget": precision_at_rate(labels[100:], challenger[100:], BUDGET)}


def test_without_card_ids_rows_are_the_unit(scored):
    labels, challenger, champion, _ = scored
    result = compare_models(labels, challenger, champion, None, SETTINGS, review_rate=BUDGET)
    assert (result.auc_roc.method, result.average_precision.method) == ("delong", "bootstrap")
    assert result.recall_at_budget.method == "bootstrap" and result.recall_at_budget.units == 2000
    assert result.auc_roc.units == 2000


def test_only_rows_both_models_scored_enter(scored):
    labels, challenger, champion, cards = scored
    broken_challenger, broken_champion = challenger.copy(), champion.copy()
    broken_challenger[:100] = np.nan
    broken_champion[100:150] = np.inf
    result = compare_models(labels, broken_challenger, broken_champion, cards, SETTINGS, review_rate=BUDGET)
    kept = compare_models(labels[150:], challenger[150:], champion[150:], cards[150:], SETTINGS, review_rate=BUDGET)
    assert result == kept and result.n == 1850


def test_the_same_rows_give_the_same_comparison(scored):
    first = compare_models(*scored, SETTINGS, review_rate=BUDGET)
    assert compare_models(*scored, SETTINGS, review_rate=BUDGET) == first


def test_json_round_trip_keeps_undefined_intervals():
    labels = np.zeros(40, dtype=np.int64)  # no fraud: every interval undefined
    scores = np.linspace(0.01, 0.5, 40)
    result = compare_models(labels, scores, scores[::-1], None, SETTINGS, review_rate=BUDGET)
    assert math.isnan(result.auc_roc.upper) and math.isnan(result.average_precision.estimate)
    assert math.isnan(result.recall_at_budget.upper)
    text = json.dumps(result.to_dict()).replace("NaN", "null")  # what the gate report stores
    back = Comparison.from_dict(json.loads(text))
    assert math.isnan(back.auc_roc.upper) and back.psi == pytest.approx(result.psi)
    assert back.auc_roc.method == result.auc_roc.method and back.n == 40
    assert back.review_budget == BUDGET and math.isnan(back.recall_at_budget.upper)
    assert back.recall_at_budget.method == result.recall_at_budget.method


def test_json_round_trip_is_exact_for_defined_intervals(scored):
    result = compare_models(*scored, SETTINGS, review_rate=BUDGET)
    assert Comparison.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_a_comparison_stored_before_budgets_reads_with_undefined_budget_intervals(scored):
    stored = compare_models(*scored, SETTINGS, review_rate=BUDGET).to_dict()
    for key in ("review_budget", "recall_at_budget", "precision_at_budget"):
        del stored[key]
    back = Comparison.from_dict(json.loads(json.dumps(stored)))
    assert back.review_budget is None
    assert all(math.isnan(v) for v in (back.recall_at_budget.estimate, back.recall_at_budget.lower,
                                       back.precision_at_budget.upper))
    assert back.recall_at_budget.confidence == 0.9 and back.auc_roc.units == len(set(scored[3]))
