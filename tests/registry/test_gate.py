"""The pure promotion decision: every rule and guardrail, in both modes, and the non-inferiority test
on paired intervals -- first on given intervals, then from scores through the real comparison."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from pipeline.metrics import PairedDifference, classification_report
from pipeline.registry.comparison import Comparison, compare_models
from pipeline.registry.config import GateConfig, Guardrail
from pipeline.registry.gate import INSUFFICIENT_EVIDENCE, should_promote

CHAMPION = {"auc_roc": 0.90, "average_precision": 0.60, "ece": 0.01, "n_fraud": 200, "nan_share": 0.0}
GOOD = {"auc_roc": 0.91, "average_precision": 0.61, "ece": 0.01, "n_fraud": 200, "nan_share": 0.0}
CONFIG = GateConfig(auc_margin=0.002, first_model_auc_floor=0.8, ap_tolerance=Guardrail(0.02),
                    ece_limit=Guardrail(0.05), psi_limit=Guardrail(0.25), min_holdout_frauds=Guardrail(50),
                    max_nan_share=Guardrail(0.0))


def diff(estimate: float, lower: float, upper: float, method: str = "delong-clustered") -> PairedDifference:
    return PairedDifference(estimate, lower, upper, 0.95, method, 900)


def paired(auc=(0.01, 0.005, 0.015), ap=(0.01, -0.01, 0.03), psi=0.05) -> Comparison:
    """Challenger - champion: AUC and AP as (estimate, lower, upper)."""
    return Comparison(diff(*auc), diff(*ap, method="bootstrap-clustered"), psi, 5000, 200)


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


def decide(labels, challenger, champion, cards):
    comparison = compare_models(labels, challenger, champion, cards, CONFIG.intervals)
    metrics = [{**classification_report(labels, s), "nan_share": 0.0} for s in (challenger, champion)]
    return comparison, should_promote(metrics[0], metrics[1], CONFIG, comparison)


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
