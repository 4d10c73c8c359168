"""The pure promotion decision: every rule and guardrail, in both modes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.registry.config import GateConfig, Guardrail
from pipeline.registry.gate import INSUFFICIENT_EVIDENCE, should_promote

CHAMPION = {"auc_roc": 0.90, "average_precision": 0.60, "ece": 0.01, "n_fraud": 200, "nan_share": 0.0}
GOOD = {"auc_roc": 0.91, "average_precision": 0.61, "ece": 0.01, "n_fraud": 200, "nan_share": 0.0, "psi": 0.05}
CONFIG = GateConfig(first_model_auc_floor=0.8, ap_tolerance=Guardrail(0.02), ece_limit=Guardrail(0.05),
                    psi_limit=Guardrail(0.25), min_holdout_frauds=Guardrail(50), max_nan_share=Guardrail(0.0))


def test_better_challenger_is_promoted_with_the_passed_checks_as_reasons():
    decision = should_promote(GOOD, CHAMPION, CONFIG)
    assert decision.promote
    assert any("AUC-ROC 0.9100 >= champion 0.9000" in r for r in decision.reasons)
    assert decision.warnings == ()


def test_equal_auc_is_enough_with_zero_delta():
    assert should_promote({**GOOD, "auc_roc": 0.90}, CHAMPION, CONFIG).promote


def test_worse_auc_is_rejected_and_says_so():
    decision = should_promote({**GOOD, "auc_roc": 0.89}, CHAMPION, CONFIG)
    assert not decision.promote
    assert decision.reasons == ("AUC-ROC 0.8900 is below champion 0.9000 + 0",)


def test_min_auc_delta_requires_a_margin():
    config = replace(CONFIG, min_auc_delta=0.02)
    assert not should_promote(GOOD, CHAMPION, config).promote
    assert should_promote({**GOOD, "auc_roc": 0.93}, CHAMPION, config).promote


def test_first_model_needs_the_floor():
    first = {k: v for k, v in GOOD.items() if k != "psi"}
    assert should_promote(first, None, CONFIG).promote
    decision = should_promote({**first, "auc_roc": 0.79}, None, CONFIG)
    assert not decision.promote
    assert "below the floor 0.8000" in decision.reasons[0]


# Each guardrail with a challenger that breaks only it, and the words its failure must contain.
BROKEN = {
    "ap_tolerance": ({"average_precision": 0.57}, "average precision"),
    "ece_limit": ({"ece": 0.08}, "calibration: ECE 0.0800"),
    "psi_limit": ({"psi": 0.4}, "PSI vs champion 0.4000"),
    "min_holdout_frauds": ({"n_fraud": 20}, INSUFFICIENT_EVIDENCE),
    "max_nan_share": ({"nan_share": 0.01}, "NaN scores"),
}


@pytest.mark.parametrize("rail", sorted(BROKEN))
def test_guardrail_in_block_mode_rejects(rail):
    change, words = BROKEN[rail]
    decision = should_promote({**GOOD, **change}, CHAMPION, CONFIG)
    assert not decision.promote
    assert len(decision.reasons) == 1 and words in decision.reasons[0]


@pytest.mark.parametrize("rail", sorted(BROKEN))
def test_guardrail_in_warn_mode_promotes_with_a_warning(rail):
    change, words = BROKEN[rail]
    config = replace(CONFIG, **{rail: Guardrail(getattr(CONFIG, rail).value, "warn")})
    decision = should_promote({**GOOD, **change}, CHAMPION, config)
    assert decision.promote
    assert len(decision.warnings) == 1 and words in decision.warnings[0]
    assert "warn mode" in decision.warnings[0]


def test_undefined_auc_is_insufficient_evidence_even_for_a_first_model():
    decision = should_promote({**GOOD, "auc_roc": float("nan")}, None, CONFIG)
    assert not decision.promote
    assert INSUFFICIENT_EVIDENCE in decision.reasons[0]


def test_nan_guardrail_metric_never_passes():
    decision = should_promote({**GOOD, "ece": float("nan")}, CHAMPION, CONFIG)
    assert not decision.promote
    assert "ECE nan" in decision.reasons[0]


def test_all_blocking_failures_are_reported_together():
    decision = should_promote({**GOOD, "auc_roc": 0.5, "ece": 0.3, "n_fraud": 3}, CHAMPION, CONFIG)
    assert not decision.promote
    assert len(decision.reasons) == 3
