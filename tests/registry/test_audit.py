"""The printed audit history: current aliases, their operating points, one line per record."""

from __future__ import annotations

import numpy as np

from pipeline.decisions.operating_points import DecisionBudget, choose_operating_points
from pipeline.registry.audit import AuditRecord, format_history


def test_printed_history_lists_aliases_and_records():
    records = [AuditRecord("2024-03-09T02:00:00+00:00", "airflow", "promote", None, 1, "gate: ok"),
               AuditRecord("2024-03-10T09:30:00+00:00", "alice", "rollback-to-version", 2, 1, "drill")]
    lines = format_history("fraud-detector", {"champion": 1, "previous-champion": None}, records).splitlines()
    assert lines[0] == "fraud-detector: champion=v1  previous-champion=-"
    assert lines[2].split()[:5] == ["2024-03-09T02:00:00+00:00", "airflow", "promote", "-", "1"]
    assert lines[3].split()[-1] == "drill"


def test_printed_history_shows_the_operating_points_of_each_aliased_version():
    points = choose_operating_points(np.r_[np.zeros(990), np.ones(10)], np.linspace(0, 1, 1000), DecisionBudget())
    lines = format_history("fraud-detector", {"champion": 2, "previous-champion": 1, "challenger": 2}, [],
                           {2: points, 1: None}).splitlines()
    assert lines[1] == f"  v2: {points.describe()}" and "review >= 0.996 (budget: top 0.50% of payments)" in lines[1]
    assert lines[2] == "  v1: no operating points (decided with serving.toml thresholds)"
    assert lines[3].split()[:2] == ["time", "actor"]
