"""Gate report storage (JSON round trip, NaN-safe) and its printed form."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from pipeline.decisions.operating_points import (
    DecisionBudget,
    OperatingPoints,
    SplitFigures,
)
from pipeline.evaluation.comparison import Comparison
from pipeline.evaluation.gate import Decision
from pipeline.evaluation.report import (
    EXIT_PROMOTED,
    EXIT_REJECTED,
    PROMOTED,
    REJECTED,
    GateReport,
    OwnThresholds,
    format_gate_report,
)
from pipeline.metrics import PairedDifference

NAN = float("nan")
COMPARISON = Comparison(
    auc_roc=PairedDifference(NAN, NAN, NAN, 0.95, "delong-clustered", 0),
    average_precision=PairedDifference(-0.0123, -0.0311, 0.0052, 0.95, "bootstrap-clustered", 412),
    psi=0.0871, n=800, n_fraud=139, review_budget=0.005,
    recall_at_budget=PairedDifference(-0.0432, -0.0719, -0.0144, 0.95, "bootstrap-clustered", 412),
    precision_at_budget=PairedDifference(-0.25, -0.5, 0.0, 0.95, "bootstrap-clustered", 412))
POINTS = OperatingPoints(0.0213, 0.412, "precision", DecisionBudget(review_rate=0.005),
                         SplitFigures(800, 40, 0.005, 0.001, 0.3, 0.75, 0.9))
CHALLENGER_THRESHOLDS = OwnThresholds(POINTS, SplitFigures(800, 139, 0.00625, 0.00125, 0.0288, 0.8, NAN))


def report(outcome=REJECTED, promote=False, **kw) -> GateReport:
    return GateReport(
        model_name="fraud-detector", outcome=outcome, challenger_version=4, champion_version=3,
        decision=Decision(promote, ("NaN scores: 100.00% of holdout rows (limit 0.00%)",), ("score shift",)),
        challenger_metrics={"auc_roc": NAN, "ece": NAN, "nan_share": 1.0, "n": 800, "n_fraud": 139},
        champion_metrics={"auc_roc": 0.84, "ece": 0.04, "nan_share": 0.0, "n": 800, "n_fraud": 139},
        comparison=COMPARISON,
        holdout={"dataset": "transactions", "version": "v1", "split": "test", "start": "2024-03-07",
                 "end": "2024-03-08", "n": 800, "n_fraud": 139},
        decided_at="2024-03-09T02:00:00+00:00", actor="airflow", review_budget=0.005,
        budget_source="the challenger's operating points", challenger_thresholds=CHALLENGER_THRESHOLDS, **kw)


def test_json_is_strict_and_round_trips_nan_metrics():
    original = report()
    text = original.to_json()
    assert json.loads(text)["challenger_metrics"]["auc_roc"] is None  # strict JSON: no NaN literal
    back = GateReport.from_json(text)
    assert math.isnan(back.challenger_metrics["auc_roc"])
    assert back.decision == original.decision and back.holdout == original.holdout
    assert json.loads(text)["comparison"]["auc_roc"]["upper"] is None
    assert math.isnan(back.comparison.auc_roc.upper)
    assert back.comparison.average_precision == COMPARISON.average_precision and back.comparison.psi == 0.0871
    assert back.as_replay().replayed and not back.replayed


def test_json_round_trips_the_budget_and_each_models_thresholds():
    back = GateReport.from_json(report().to_json())
    assert (back.review_budget, back.budget_source) == (0.005, "the challenger's operating points")
    assert back.challenger_thresholds.points == POINTS and back.champion_thresholds is None
    assert back.challenger_thresholds.holdout.recall == 0.0288
    assert math.isnan(back.challenger_thresholds.holdout.block_precision)  # stored as null
    assert back.comparison.recall_at_budget == COMPARISON.recall_at_budget and back.comparison.review_budget == 0.005


def test_reports_recorded_before_budgets_existed_still_load():
    old = json.loads(report().to_json())
    for key in ("review_budget", "budget_source", "challenger_thresholds", "champion_thresholds"):
        del old[key]
    for key in ("review_budget", "recall_at_budget", "precision_at_budget"):
        del old["comparison"][key]
    back = GateReport.from_json(json.dumps(old))
    assert back.review_budget is None and back.challenger_thresholds is None
    assert back.comparison.review_budget is None and math.isnan(back.comparison.recall_at_budget.upper)
    text = format_gate_report(back)
    assert "review budget" not in text and "recall_at_budget" not in text


def test_reports_recorded_before_intervals_existed_still_load():
    old = json.loads(report().to_json())
    del old["comparison"]
    old["challenger_metrics"]["psi"] = 0.3
    assert GateReport.from_json(json.dumps(old)).comparison is None


def test_exit_codes_follow_the_decision():
    assert report().exit_code == EXIT_REJECTED == 3
    assert report(outcome=PROMOTED, promote=True).exit_code == EXIT_PROMOTED == 0


def test_printed_report_shows_both_models_and_every_reason():
    text = format_gate_report(report(replayed=True))
    assert "challenger v4 vs champion v3" in text
    assert "transactions@v1 test 2024-03-07..2024-03-08 (800 rows, 139 frauds)" in text
    auc_line = next(line for line in text.splitlines() if line.startswith("auc_roc"))
    assert auc_line.split() == ["auc_roc", "nan", "0.8400"]
    assert "REJECTED: champion stays v3 (recorded decision of an identical gate run" in text
    assert "  x NaN scores: 100.00%" in text and "  ! score shift" in text
    lines = text.splitlines()
    header = lines.index("challenger - champion on the 800 rows both scored (139 frauds):")
    assert lines[header + 1].split() == ["auc_roc", "difference", "undefined,", "95%", "CI", "undefined",
                                         "(delong-clustered,", "0", "cards)"]
    assert lines[header + 2].split() == ["average_precision", "difference", "-0.0123,", "95%", "CI", "[-0.0311,",
                                         "+0.0052]", "(bootstrap-clustered,", "412", "cards)"]
    assert lines[header + 3].split() == ["recall_at_budget", "difference", "-0.0432,", "95%", "CI", "[-0.0719,",
                                         "-0.0144]", "(bootstrap-clustered,", "412", "cards)"]
    assert lines[header + 4].split()[0] == "precision_at_budget"
    assert lines[header + 5].split() == ["psi", "0.0871"]


def test_printed_report_shows_the_budget_each_models_thresholds_and_their_holdout_figures():
    shown = replace(report(), challenger_metrics={"recall_at_budget": 0.0288, "precision_at_budget": 0.8},
                    champion_metrics={"recall_at_budget": 0.072})
    text = format_gate_report(shown)
    lines = text.splitlines()
    assert "review budget: top 0.50% of payments (the challenger's operating points)" in lines
    assert next(line for line in lines if line.startswith("recall_at_budget")).split() == [
        "recall_at_budget", "0.0288", "0.0720"]
    at = lines.index("  challenger v4: review >= 0.0213 (budget: top 0.50% of payments), "
                     "block >= 0.412 (precision target 0.9)")
    assert lines[at + 1].split() == ["holdout:", "review", "rate", "0.62%,", "recall", "0.0288,", "precision",
                                     "0.8000,", "block", "rate", "0.12%"]
    assert "  champion v3: no operating points (see the notes)" in lines
