"""Gate report storage (JSON round trip, NaN-safe) and the printed forms."""

from __future__ import annotations

import json
import math

from pipeline.metrics import PairedDifference
from pipeline.registry.audit import AuditRecord
from pipeline.registry.comparison import Comparison
from pipeline.registry.gate import Decision
from pipeline.registry.report import (
    EXIT_PROMOTED,
    EXIT_REJECTED,
    PROMOTED,
    REJECTED,
    GateReport,
    format_gate_report,
    format_history,
)

NAN = float("nan")
COMPARISON = Comparison(
    auc_roc=PairedDifference(NAN, NAN, NAN, 0.95, "delong-clustered", 0),
    average_precision=PairedDifference(-0.0123, -0.0311, 0.0052, 0.95, "bootstrap-clustered", 412),
    psi=0.0871, n=800, n_fraud=139)


def report(outcome=REJECTED, promote=False, **kw) -> GateReport:
    return GateReport(
        model_name="fraud-detector", outcome=outcome, challenger_version=4, champion_version=3,
        decision=Decision(promote, ("NaN scores: 100.00% of holdout rows (limit 0.00%)",), ("score shift",)),
        challenger_metrics={"auc_roc": NAN, "ece": NAN, "nan_share": 1.0, "n": 800, "n_fraud": 139},
        champion_metrics={"auc_roc": 0.84, "ece": 0.04, "nan_share": 0.0, "n": 800, "n_fraud": 139},
        comparison=COMPARISON,
        holdout={"dataset": "transactions", "version": "v1", "split": "test", "start": "2024-03-07",
                 "end": "2024-03-08", "n": 800, "n_fraud": 139},
        decided_at="2024-03-09T02:00:00+00:00", actor="airflow", **kw)


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
    assert lines[header + 3].split() == ["psi", "0.0871"]


def test_printed_history_lists_aliases_and_records():
    records = [AuditRecord("2024-03-09T02:00:00+00:00", "airflow", "promote", None, 1, "gate: ok"),
               AuditRecord("2024-03-10T09:30:00+00:00", "alice", "rollback-to-version", 2, 1, "drill")]
    lines = format_history("fraud-detector", {"champion": 1, "previous-champion": None}, records).splitlines()
    assert lines[0] == "fraud-detector: champion=v1  previous-champion=-"
    assert lines[2].split()[:5] == ["2024-03-09T02:00:00+00:00", "airflow", "promote", "-", "1"]
    assert lines[3].split()[-1] == "drill"
