"""The paired comparison of challenger and champion: which rows enter, which unit is resampled,
determinism, and storage."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.metrics import auc_roc, average_precision
from pipeline.registry.comparison import Comparison, compare_models
from pipeline.registry.config import IntervalConfig

SETTINGS = IntervalConfig(confidence=0.9, bootstrap_resamples=200, seed=5)


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
    result = compare_models(labels, challenger, champion, cards, SETTINGS)
    assert result.auc_roc.estimate == pytest.approx(auc_roc(labels, challenger) - auc_roc(labels, champion))
    assert result.average_precision.estimate == pytest.approx(
        average_precision(labels, challenger) - average_precision(labels, champion))
    assert (result.auc_roc.method, result.average_precision.method) == ("delong-clustered", "bootstrap-clustered")
    assert result.auc_roc.units == result.average_precision.units == len(set(cards))
    assert result.auc_roc.confidence == 0.9
    assert (result.n, result.n_fraud) == (2000, labels.sum())


def test_without_card_ids_rows_are_the_unit(scored):
    labels, challenger, champion, _ = scored
    result = compare_models(labels, challenger, champion, None, SETTINGS)
    assert (result.auc_roc.method, result.average_precision.method) == ("delong", "bootstrap")
    assert result.auc_roc.units == 2000


def test_only_rows_both_models_scored_enter(scored):
    labels, challenger, champion, cards = scored
    broken_challenger, broken_champion = challenger.copy(), champion.copy()
    broken_challenger[:100] = np.nan
    broken_champion[100:150] = np.inf
    result = compare_models(labels, broken_challenger, broken_champion, cards, SETTINGS)
    kept = compare_models(labels[150:], challenger[150:], champion[150:], cards[150:], SETTINGS)
    assert result == kept and result.n == 1850


def test_the_same_rows_give_the_same_comparison(scored):
    first = compare_models(*scored, SETTINGS)
    assert compare_models(*scored, SETTINGS) == first


def test_json_round_trip_keeps_undefined_intervals():
    labels = np.zeros(40, dtype=np.int64)  # no fraud: every interval undefined
    scores = np.linspace(0.01, 0.5, 40)
    result = compare_models(labels, scores, scores[::-1], None, SETTINGS)
    assert math.isnan(result.auc_roc.upper) and math.isnan(result.average_precision.estimate)
    text = json.dumps(result.to_dict()).replace("NaN", "null")  # what the gate report stores
    back = Comparison.from_dict(json.loads(text))
    assert math.isnan(back.auc_roc.upper) and back.psi == pytest.approx(result.psi)
    assert back.auc_roc.method == result.auc_roc.method and back.n == 40
