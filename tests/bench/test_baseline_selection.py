"""The baseline bench's narrowing: a full run by default, $FRAUD_BENCH_BASELINE_* pick portfolios, layouts,
models and seeds, and only the goals whose models ran are judged."""

from __future__ import annotations

import pytest

from pipeline.bench.baseline import (
    MODELS,
    SAMPLED,
    SEEDS,
    Selection,
    SelectionError,
    goals_met,
    selection_from_env,
)
from pipeline.bench.dataset import PRESETS


def test_without_the_variables_a_run_covers_everything():
    selection = selection_from_env({})
    assert selection == Selection(PRESETS, MODELS, SEEDS, ("standard", "short")) and selection.full


def test_the_variables_narrow_the_run_in_the_bench_order():
    selection = selection_from_env({"FRAUD_BENCH_BASELINE_PORTFOLIOS": "default",
                                    "FRAUD_BENCH_BASELINE_MODELS": f"{SAMPLED}, ours",
                                    "FRAUD_BENCH_BASELINE_SEEDS": "3,1"})
    assert selection == Selection(("default",), ("ours", SAMPLED), (1, 3)) and not selection.full


def test_the_layout_variable_narrows_the_layouts():
    selection = selection_from_env({"FRAUD_BENCH_BASELINE_LAYOUTS": "short"})
    assert selection.layouts == ("short",) and selection.portfolios == PRESETS and not selection.full
    with pytest.raises(SelectionError, match="FRAUD_BENCH_BASELINE_LAYOUTS.*standard, short"):
        selection_from_env({"FRAUD_BENCH_BASELINE_LAYOUTS": "long"})


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(SelectionError, match="FRAUD_BENCH_BASELINE_MODELS.*lightgbm"):
        selection_from_env({"FRAUD_BENCH_BASELINE_MODELS": "ours,xgboost"})


def _figures(auc: float, ap: float, ece: float, train_s: float) -> dict[str, float]:
    return {"auc_roc": auc, "average_precision": ap, "ece_test": ece, "ece_test_prior_corrected": ece, "train_s": train_s,
            "card_precision_at_100": 0.5}


def test_only_the_goals_of_the_models_that_ran_are_judged():
    results = {"ours": _figures(0.945, 0.520, 0.001, 400.0), SAMPLED: _figures(0.944, 0.516, 0.001, 90.0)}
    goals = goals_met(results)
    assert goals == {"test_week_ece_at_most_0.02": True, "test_week_ece_prior_corrected_at_most_0.02": True,
                     "sampled_ap_auc_at_most_0.005_below": True, "sampled_ece_at_most_0.02": True,
                     "sampled_train_time_at_most_0.25": True}
    results[SAMPLED] = _figures(0.944, 0.510, 0.001, 101.0)
    assert not goals_met(results)["sampled_ap_auc_at_most_0.005_below"]
    assert not goals_met(results)["sampled_train_time_at_most_0.25"]
    results[SAMPLED] = _figures(0.951, 0.550, 0.001, 90.0)  # ranks better than unsampled: nothing lost
    assert goals_met(results)["sampled_ap_auc_at_most_0.005_below"]
    results[SAMPLED] = _figures(0.939, 0.550, 0.001, 90.0)  # AP gained, AUC lost
    assert not goals_met(results)["sampled_ap_auc_at_most_0.005_below"]
