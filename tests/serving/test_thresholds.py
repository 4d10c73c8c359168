"""Which thresholds a version serves with: its operating points, serving.toml's override, or the fallback."""

from __future__ import annotations

import pytest

from pipeline.decisions.operating_points import DecisionBudget, OperatingPoints, explicit_operating_points
from pipeline.serving.config import DecisionConfig
from pipeline.serving.errors import ModelRejected
from pipeline.serving.thresholds import thresholds_for

BUDGET = DecisionBudget(review_rate=0.01, block_precision=0.0, block_rate=0.001)
POINTS = OperatingPoints(review_threshold=0.03, block_threshold=0.4, block_rule="rate", budget=BUDGET)
CONFIG = DecisionConfig(review_threshold=0.5, block_threshold=0.9)


def test_by_default_a_version_decides_at_its_own_operating_points():
    t = thresholds_for(7, POINTS, CONFIG)
    assert (t.review_threshold, t.block_threshold, t.source, t.budget, t.warning) == (0.03, 0.4, "version", BUDGET,
                                                                                       None)


def test_the_config_override_ignores_the_versions_points_and_has_no_budget():
    t = thresholds_for(7, POINTS, DecisionConfig(thresholds="config", review_threshold=0.2, block_threshold=0.7))
    assert (t.review_threshold, t.block_threshold, t.source, t.budget) == (0.2, 0.7, "config", None)
    assert t.points == POINTS  # still shown on /health


def test_a_version_without_points_falls_back_to_the_config_with_a_warning():
    t = thresholds_for(7, None, CONFIG)
    assert (t.review_threshold, t.block_threshold, t.source, t.budget) == (0.5, 0.9, "config_fallback", None)
    assert "version 7 ships no operating points" in t.warning


def test_a_version_without_points_is_refused_when_config_says_so():
    with pytest.raises(ModelRejected, match=r'version 7 ships no operating points .*without_operating_points = "refuse"'):
        thresholds_for(7, None, DecisionConfig(without_operating_points="refuse"))
    # Under the override the version's points are not needed: it serves.
    override = DecisionConfig(thresholds="config", without_operating_points="refuse")
    assert thresholds_for(7, None, override).source == "config"


def test_explicit_operating_points_decide_but_carry_no_budget():
    t = thresholds_for(7, explicit_operating_points(0.3, 0.8, "train.toml override"), CONFIG)
    assert (t.review_threshold, t.block_threshold, t.source, t.budget) == (0.3, 0.8, "version", None)
