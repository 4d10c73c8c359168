"""A version's figures on a monitored day: judged at the thresholds each payment was decided at."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import date

import numpy as np
import pytest

from pipeline.decisions.operating_points import DecisionBudget, OperatingPoints
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.figures import VersionReference, version_figures
from pipeline.monitoring.join import ScoredPayment

DAY = date(2026, 3, 1)
POINTS = OperatingPoints(0.2, 0.8, "rate", DecisionBudget(review_rate=0.1, block_precision=0.0, block_rate=0.01))
CONFIG = MonitoringConfig(alert_rate_band=0.5, score_psi_warn=0.25, feature_psi_warn=0.25)


def payments(scores, review=0.2, block=0.8, amounts=None) -> list[ScoredPayment]:
    amounts = amounts if amounts is not None else [float(i % 50) for i in range(len(scores))]
    return [ScoredPayment(f"tx-{i}", 1, float(s), review, block, i, {"amount": a, "mcc_code": i % 3})
            for i, (s, a) in enumerate(zip(scores, amounts, strict=True))]


def reference(**changes) -> VersionReference:
    rng = np.random.default_rng(0)
    base = VersionReference(
        version=1, run_id="r", operating_points=POINTS, expected_recall=0.6, expected_recall_source="gate.expected_recall",
        validation_scores=None, training_features={"amount": rng.integers(0, 50, 5000).astype(float),
                                                   "mcc_code": rng.integers(0, 3, 5000)},
        training_sample="5000 rows", categorical=frozenset({"mcc_code"}))
    return replace(base, **changes)


def test_recall_precision_and_the_alert_rate_at_the_operating_points():
    # 100 payments: 10 flagged (score >= 0.2), 2 of them blocked (>= 0.8); 5 frauds, 4 of them flagged.
    scores = np.r_[[0.9, 0.85], [0.5] * 8, [0.01] * 90]
    labels = np.zeros(100, dtype=np.int64)
    labels[[0, 2, 3, 4, 50]] = 1
    f = version_figures(payments(scores), labels, reference(), CONFIG)
    at = f.at_operating_points
    assert (at.rows, at.frauds) == (100, 5)
    assert (at.review_rate, at.block_rate, at.recall, at.precision, at.block_precision) == (0.1, 0.02, 0.8, 0.4, 0.5)
    assert (f.review_budget, f.review_rate_vs_budget, f.alert_rate_in_band) == (0.1, 1.0, True)
    assert f.review_thresholds == (0.2,) and f.block_thresholds == (0.8,)
    assert 0.5 < f.auc_roc <= 1.0 and not math.isnan(f.average_precision)


def test_each_payment_is_judged_at_its_own_thresholds_and_an_override_is_a_finding():
    scores = np.array([0.3, 0.3, 0.3, 0.01])
    labels = np.array([1, 1, 0, 0])
    mixed = payments(scores[:2]) + payments(scores[2:], review=0.5, block=0.9)  # an explicit override for half
    f = version_figures(mixed, labels, reference(), CONFIG)
    assert f.at_operating_points.recall == 1.0 and f.at_operating_points.review_rate == 0.5
    assert f.review_thresholds == (0.2, 0.5)
    assert any("2 of 4 decisions were made at thresholds other than the version's" in x for x in f.findings)


def test_a_review_threshold_tracked_on_live_scores_is_no_override_finding():
    scores = np.array([0.3, 0.3, 0.3, 0.01])
    tracked = payments(scores[:2], review=0.25) + payments(scores[2:], review=0.31)  # the block threshold kept
    f = version_figures(tracked, np.array([1, 1, 0, 0]), reference(), CONFIG)
    assert f.review_thresholds == (0.25, 0.31) and f.at_operating_points.recall == 1.0
    assert f.at_operating_points.review_rate == 0.5  # the third payment (0.3) is under its 0.31
    assert not any("thresholds other than the version's" in x for x in f.findings)


def test_an_alert_rate_outside_the_band_and_drifting_scores_are_findings():
    scores = np.r_[[0.5] * 30, [0.01] * 70]  # 30% flagged against a 10% budget
    validation = np.random.default_rng(1).beta(1, 60, 5000)
    f = version_figures(payments(scores), np.zeros(100, dtype=np.int64), reference(validation_scores=validation), CONFIG)
    assert f.review_rate_vs_budget == pytest.approx(3.0) and f.alert_rate_in_band is False
    assert any("3.00x the budget" in x for x in f.findings)
    assert f.score_psi > 0.25 and any("live scores drifted from validation" in x for x in f.findings)
    assert math.isnan(f.auc_roc)  # no fraud: undefined, not 0.5


def test_a_feature_stuck_in_serving_is_named_and_a_feature_never_served_has_no_psi():
    f = version_figures(payments(np.full(200, 0.01), amounts=[7.0] * 200), np.zeros(200, dtype=np.int64),
                        reference(training_features={**reference().training_features, "velocity": np.ones(10)}), CONFIG)
    assert f.feature_psi["amount"] > 1.0 and f.feature_psi["mcc_code"] < 0.05
    assert "velocity" not in f.feature_psi
    assert any("drifted from the training split" in x and "amount" in x for x in f.findings)
    assert any("absent from every score event (no PSI): velocity" in x for x in f.findings)


def test_without_a_reference_the_figures_are_still_computed_and_the_gaps_said():
    bare = reference(operating_points=None, training_features=None, notes=("v1 is not in the registry",))
    f = version_figures(payments([0.9, 0.1]), np.array([1, 0]), bare, CONFIG)
    assert f.at_operating_points.recall == 1.0 and f.review_budget is None and f.alert_rate_in_band is None
    assert math.isnan(f.score_psi) and f.feature_psi == {} and f.findings == ("v1 is not in the registry",)


def test_the_live_figures_name_a_feature_broken_in_one_segment_and_a_field_out_of_its_range():
    config = replace(CONFIG, stuck_feature_share=0.99, segment_features=("mcc_code",), segment_kept=0.5,
                     range_features=("amount",), out_of_range_share=0.02)
    n = 900
    healthy = [float(i % 50) for i in range(n)]  # mcc_code is i % 3: each code 300 rows
    stuck_in_code_1 = [7.0 if i % 3 == 1 else a for i, a in enumerate(healthy)]
    f = version_figures(payments(np.full(n, 0.01), amounts=stuck_in_code_1), np.zeros(n, dtype=np.int64),
                        reference(), config)
    assert f.stuck_features == ("amount@mcc_code=1",) and f.out_of_range_features == ()
    in_cents = [a * 100.0 if i % 10 == 0 else a for i, a in enumerate(healthy)]  # 10% of the day x100
    f = version_figures(payments(np.full(n, 0.01), amounts=in_cents), np.zeros(n, dtype=np.int64), reference(), config)
    assert f.out_of_range_features == ("amount",) and f.stuck_features == ()
    f = version_figures(payments(np.full(n, 0.01), amounts=healthy), np.zeros(n, dtype=np.int64), reference(), config)
    assert f.stuck_features == () and f.out_of_range_features == ()
