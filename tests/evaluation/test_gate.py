"""The pure promotion decision: every rule and guardrail, in both modes, and the non-inferiority test
on paired intervals -- first on given intervals, then from scores through the real comparison."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pipeline.decisions.operating_points import DecisionBudget, explicit_operating_points
from pipeline.evaluation.comparison import Comparison, budget_metrics, compare_models
from pipeline.evaluation.config import GateConfig, Guardrail
from pipeline.evaluation.gate import INSUFFICIENT_EVIDENCE, comparison_budget, should_promote
from pipeline.metrics import PairedDifference, classification_report

CHAMPION = {"auc_roc": 0.90, "average_precision": 0.60, "recall_at_budget": 0.40, "precision_at_budget": 0.30,
            "ece": 0.01, "n_fraud": 200, "nan_share": 0.0}
GOOD = {"auc_roc": 0.91, "average_precision": 0.61, "recall_at_budget": 0.42, "precision_at_budget": 0.31,
        "ece": 0.01, "n_fraud": 200, "nan_share": 0.0}
CONFIG = GateConfig(auc_margin=0.002, first_model_auc_floor=0.8, ap_tolerance=Guardrail(0.02),
                    ece_limit=Guardrail(0.05), psi_limit=Guardrail(0.25), min_holdout_frauds=Guardrail(50),
                    max_nan_share=Guardrail(0.0), budget_recall_margin=Guardrail(0.02, "block"))


def diff(estimate: float, lower: float, upper: float, method: str = "delong-clustered") -> PairedDifference:
    return PairedDifference(estimate, lower, upper, 0.95, method, 900)


def paired(auc=(0.01, 0.005, 0.015), ap=(0.01, -0.01, 0.03), psi=0.05, recall=(0.02, -0.03, 0.07),
           precision=(0.01, -0.02, 0.04)) -> Comparison:
    """Challenger - champion: AUC, AP and recall/precision at a 0.5% budget as (estimate, lower, upper)."""
    boot = "bootstrap-clustered"
    return Comparison(diff(*auc), diff(*ap, method=boot), psi, 5000, 200, 0.005, diff(*recall, method=boot),
                      diff(*precision, method=boot))


def test_better_challenger_is_promoted_with_the_intervals_in_the_reasons():
    decision = should_promote(GOOD, CHAMPION, CONFIG, paired())
    assert decision.promote and decision.warnings == ()
    assert ("AUC-ROC 0.9100 vs champion 0.9000: difference +0.0100, 95% CI [+0.0050, +0.0150], "
            "not shown worse by more than 0.002") in decision.reasons


def test_a_difference_inside_the_noise_promotes_even_with_a_lower_point_estimate():
    """Night 2 of the demo: AUC 0.9976 vs 0.9977 on a few thousand rows."""
    decision = should_promote({**GOOD, "auc_roc": 0.9976}, {**CHAMPION, "auc_roc": 0.9977},
                              replace(CONFIG, auc_margin=0.0), paired(auc=(-0.0001, -0.0012, 0.0010)))
    assert decision.promote


def test_worse_beyond_the_margin_with_confidence_is_rejected_and_says_so():
    decision = should_promote({**GOOD, "auc_roc": 0.89}, CHAMPION, CONFIG, paired(auc=(-0.01, -0.015, -0.005)))
    assert not decision.promote
    assert decision.reasons == ("AUC-ROC 0.8900 is below champion 0.9000 by more than the margin 0.002: "
                                "difference -0.0100, 95% CI [-0.0150, -0.0050] lies entirely below -0.002",)


def test_the_margin_tolerates_a_small_but_certain_loss():
    certain_small_loss = paired(auc=(-0.001, -0.0015, -0.0005))
    assert should_promote(GOOD, CHAMPION, CONFIG, certain_small_loss).promote
    assert not should_promote(GOOD, CHAMPION, replace(CONFIG, auc_margin=0.0), certain_small_loss).promote


def test_an_undefined_interval_is_insufficient_evidence():
    nan = math.nan
    decision = should_promote(GOOD, CHAMPION, CONFIG, paired(auc=(nan, nan, nan)))
    assert not decision.promote
    assert decision.reasons[0].startswith(f"{INSUFFICIENT_EVIDENCE}: no AUC-ROC interval")


def test_a_champion_without_a_comparison_is_a_programming_error():
    with pytest.raises(ValueError, match="paired comparison"):
        should_promote(GOOD, CHAMPION, CONFIG)


def test_first_model_needs_the_floor():
    assert should_promote(GOOD, None, CONFIG).promote
    decision = should_promote({**GOOD, "auc_roc": 0.79}, None, CONFIG)
    assert not decision.promote
    assert "below the floor 0.8000" in decision.reasons[0]


# Each guardrail with a challenger that breaks only it (metrics, comparison), and the words its failure must contain.
BROKEN = {
    "ap_tolerance": ({}, {"ap": (-0.05, -0.07, -0.03)}, "average precision 0.6100 is below champion 0.6000 by more"),
    "ece_limit": ({"ece": 0.08}, {}, "calibration: ECE 0.0800"),
    "psi_limit": ({}, {"psi": 0.4}, "PSI vs champion 0.4000"),
    "min_holdout_frauds": ({"n_fraud": 20}, {}, INSUFFICIENT_EVIDENCE),
    "max_nan_share": ({"nan_share": 0.01}, {}, "NaN scores"),
    "budget_recall_margin": ({"recall_at_budget": 0.34}, {"recall": (-0.06, -0.09, -0.03)},
                             "recall at the review budget (top 0.50% of payments) 0.3400 is below champion 0.4000"),
}


@pytest.mark.parametrize("rail", sorted(BROKEN))
def test_guardrail_in_block_mode_rejects(rail):
    change, comparison, words = BROKEN[rail]
    decision = should_promote({**GOOD, **change}, CHAMPION, CONFIG, paired(**comparison))
    assert not decision.promote
    assert len(decision.reasons) == 1 and words in decision.reasons[0]


@pytest.mark.parametrize("rail", sorted(BROKEN))
def test_guardrail_in_warn_mode_promotes_with_a_warning(rail):
    change, comparison, words = BROKEN[rail]
    config = replace(CONFIG, **{rail: Guardrail(getattr(CONFIG, rail).value, "warn")})
    decision = should_promote({**GOOD, **change}, CHAMPION, config, paired(**comparison))
    assert decision.promote
    assert len(decision.warnings) == 1 and words in decision.warnings[0]
    assert "warn mode" in decision.warnings[0]


# Ranks better overall (AUC interval above 0) but finds fewer frauds in the share the team reviews.
WINS_AUC_LOSES_BUDGET = paired(auc=(0.02, 0.012, 0.028), recall=(-0.08, -0.12, -0.04), precision=(-0.06, -0.09, -0.03))
BUDGET_LOSER = {**GOOD, "auc_roc": 0.92, "recall_at_budget": 0.32, "precision_at_budget": 0.24}


def test_winning_auc_but_losing_recall_at_the_budget_is_rejected_in_block_mode():
    decision = should_promote(BUDGET_LOSER, CHAMPION, CONFIG, WINS_AUC_LOSES_BUDGET)
    assert not decision.promote
    assert decision.reasons == (
        "recall at the review budget (top 0.50% of payments) 0.3200 is below champion 0.4000 by more than the "
        "margin 0.02: difference -0.0800, 95% CI [-0.1200, -0.0400] lies entirely below -0.02",)


def test_winning_auc_but_losing_recall_at_the_budget_is_promoted_with_a_warning_in_warn_mode():
    config = replace(CONFIG, budget_recall_margin=Guardrail(0.02, "warn"))
    decision = should_promote(BUDGET_LOSER, CHAMPION, config, WINS_AUC_LOSES_BUDGET)
    assert decision.promote
    assert any(r.startswith("AUC-ROC 0.9200 vs champion 0.9000") for r in decision.reasons)
    [warning] = decision.warnings
    assert warning.startswith("recall at the review budget (top 0.50% of payments) 0.3200 is below champion 0.4000")
    assert warning.endswith("(guardrail in warn mode)")


def test_recall_at_the_budget_inside_the_margin_passes_and_is_shown():
    decision = should_promote(GOOD, CHAMPION, CONFIG, paired(recall=(-0.01, -0.05, 0.03)))
    assert decision.promote and decision.warnings == ()
    assert ("recall at the review budget (top 0.50% of payments) 0.4200 vs champion 0.4000: difference -0.0100, "
            "95% CI [-0.0500, +0.0300], not shown worse by more than 0.02") in decision.reasons


def test_an_undefined_budget_interval_is_insufficient_evidence():
    nan = math.nan
    decision = should_promote(GOOD, CHAMPION, CONFIG, paired(recall=(nan, nan, nan)))
    assert not decision.promote
    assert decision.reasons[0].startswith(f"{INSUFFICIENT_EVIDENCE}: no recall at the review budget")


def test_the_budget_is_the_challengers_else_the_gates_fallback():
    points = explicit_operating_points(0.2, 0.8, "test")
    budgeted = replace(points, budget=DecisionBudget(review_rate=0.01, block_rate=0.001), block_rule="rate")
    config = replace(CONFIG, review_rate=0.003)
    assert comparison_budget(budgeted, config) == (0.01, "the challenger's operating points")
    assert comparison_budget(None, config) == (0.003, "gate.review_rate (the challenger has no operating points)")
    assert comparison_budget(points, config)[0] == 0.003


def test_undefined_auc_is_insufficient_evidence_even_for_a_first_model():
    decision = should_promote({**GOOD, "auc_roc": float("nan")}, None, CONFIG)
    assert not decision.promote
    assert INSUFFICIENT_EVIDENCE in decision.reasons[0]


def test_nan_guardrail_metric_never_passes():
    decision = should_promote({**GOOD, "ece": float("nan")}, CHAMPION, CONFIG, paired())
    assert not decision.promote
    assert "ECE nan" in decision.reasons[0]


def test_all_blocking_failures_are_reported_together():
    decision = should_promote({**GOOD, "ece": 0.3, "n_fraud": 3}, CHAMPION, CONFIG, paired(auc=(-0.3, -0.35, -0.25)))
    assert not decision.promote
    assert len(decision.reasons) == 3


# --- From scores to decision, through the real paired comparison -------------------------------------


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@pytest.fixture(scope="module")
def holdout():
    """Calibrated log-odds of 6,000 payments of 1,500 cards, and labels drawn from them."""
    rng = np.random.default_rng(0)
    cards = rng.integers(0, 1500, 6000)
    logits = rng.normal(-4.5, 2.0, cards.size)
    labels = (rng.random(cards.size) < sigmoid(logits)).astype(np.int64)
    return labels, logits, cards


def decide(labels, challenger, champion, cards, config=CONFIG, budget=0.005):
    comparison = compare_models(labels, challenger, champion, cards, config.intervals, review_rate=budget)
    metrics = [{**classification_report(labels, s), **budget_metrics(labels, s, budget), "nan_share": 0.0}
               for s in (challenger, champion)]
    return comparison, should_promote(metrics[0], metrics[1], config, comparison)


def test_identical_models_have_an_interval_at_zero_and_promote(holdout):
    labels, logits, cards = holdout
    comparison, decision = decide(labels, sigmoid(logits), sigmoid(logits), cards)
    assert comparison.auc_roc.lower == 0.0 == comparison.auc_roc.upper
    assert comparison.average_precision.lower <= 0.0 <= comparison.average_precision.upper
    assert decision.promote, decision.reasons


def test_a_tiny_noisy_difference_promotes(holdout):
    """Two retrains of equal quality (the same scores up to independent noise): the challenger's
    point AUC is lower, which the old rule (challenger AUC >= champion AUC) rejected."""
    labels, logits, cards = holdout
    rng = np.random.default_rng(3)
    champion = sigmoid(logits + rng.normal(0.0, 0.3, logits.size))
    challenger = sigmoid(logits + rng.normal(0.0, 0.3, logits.size))
    comparison, decision = decide(labels, challenger, champion, cards)
    assert -0.002 < comparison.auc_roc.estimate < 0  # the data is what this test is about
    assert comparison.auc_roc.lower < 0 < comparison.auc_roc.upper and comparison.psi < 0.01
    assert decision.promote, decision.reasons


def test_a_clearly_worse_challenger_is_blocked(holdout):
    labels, logits, cards = holdout
    rng = np.random.default_rng(4)
    challenger = sigmoid(0.5 * logits - 2.2 + rng.normal(0.0, 1.0, logits.size))  # much weaker ranking
    comparison, decision = decide(labels, challenger, sigmoid(logits), cards)
    assert comparison.auc_roc.upper < -CONFIG.auc_margin
    assert not decision.promote
    assert any(r.startswith("AUC-ROC") and "lies entirely below" in r for r in decision.reasons)


@pytest.mark.parametrize("mode", ["block", "warn"])
def test_a_better_ranker_that_floods_the_budget_with_false_alarms_is_caught_at_the_budget(holdout, mode):
    """The champion ranks the riskiest 2% right and the rest noisily; the challenger ranks everything
    better but puts 1% of legitimate payments on top, which fills the 2% the team can review."""
    labels, logits, cards = holdout
    rng = np.random.default_rng(5)
    top = logits > np.quantile(logits, 0.98)
    champion = np.where(top, logits, np.minimum(logits + rng.normal(0, 1.5, logits.size), np.quantile(logits, 0.98)))
    challenger = logits + rng.normal(0, 0.3, logits.size)
    challenger[(labels == 0) & (rng.random(logits.size) < 0.01)] = 3.0
    config = replace(CONFIG, budget_recall_margin=Guardrail(0.02, mode))
    comparison, decision = decide(labels, sigmoid(challenger), sigmoid(champion), cards, config, budget=0.02)
    assert comparison.auc_roc.lower > 0 and comparison.recall_at_budget.upper < -0.02  # what the test is about
    budget_lines = [line for line in (*decision.reasons, *decision.warnings)
                    if line.startswith("recall at the review budget (top 2.00% of payments)")]
    assert len(budget_lines) == 1 and "lies entirely below -0.02" in budget_lines[0]
    if mode == "block":
        assert not decision.promote and decision.reasons == tuple(budget_lines)
    else:
        assert decision.promote and decision.warnings == tuple(budget_lines)
        assert budget_lines[0].endswith("(guardrail in warn mode)")
