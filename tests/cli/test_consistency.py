"""``fraudctl consistency``'s failure message names what fell short, and only that."""

from __future__ import annotations

from pipeline.cli.serve import consistency_shortfall
from pipeline.serving.consistency import ConsistencyReport


def test_payments_missing_offline_are_not_called_feature_mismatches():
    # 10 scored, 8 found in the raw store, all 8 equal: the shortfall is the 2 missing rows alone.
    report = ConsistencyReport("2026-11-22", scored=10, compared=8, matched=8, tolerance=1e-9)
    message = consistency_shortfall(report, 1.0)
    assert message.startswith("8 of 10 scored payments match (80.00% < 100.00%)")
    assert "2 not in the raw store (missing_offline): ingest 2026-11-22 first" in message
    assert "mismatched_features" not in message


def test_feature_mismatches_point_at_mismatched_features():
    report = ConsistencyReport("2026-11-22", scored=10, compared=10, matched=7, tolerance=1e-9,
                               mismatched_features={"card_count_1d": 3})
    message = consistency_shortfall(report, 0.9)
    assert "3 with features that differ from the offline rebuild: see mismatched_features and examples" in message
    assert "missing_offline" not in message


def test_both_shortfalls_are_named():
    report = ConsistencyReport("2026-11-22", scored=10, compared=9, matched=6, tolerance=1e-9,
                               mismatched_features={"merchant_fraud_rate_7d": 3})
    message = consistency_shortfall(report, 1.0)
    assert "1 not in the raw store" in message and "3 with features that differ" in message
