"""The compression benchmark's figures: means over seeds, paired deltas against dense, the goal."""

from __future__ import annotations

import pytest

from pipeline.bench.compression import goal_met, summarize


def _row(seed: int, auc: float, ap: float, sent: float, all_steps: float | None = None) -> dict:
    return {"seed": seed, "auc": auc, "average_precision": ap, "bytes_per_step": sent,
            "bytes_per_step_all_steps": all_steps or sent, "bytes_dense_per_step": 1000.0}


def test_summary_takes_means_and_paired_deltas_and_judges_the_goal():
    table = summarize({
        "dense": [_row(1, 0.90, 0.50, 1000.0), _row(2, 0.92, 0.40, 1000.0)],
        "sparse": [_row(1, 0.899, 0.49, 2.5, 50.0), _row(2, 0.918, 0.40, 2.5, 50.0)],
        "lossy": [_row(1, 0.90, 0.45, 2.5), _row(2, 0.92, 0.38, 2.5)],
    })
    sparse = table["sparse"]
    assert sparse["bytes_ratio"]["mean"] == 400.0 and sparse["bytes_ratio_all_steps"]["mean"] == 20.0
    assert sparse["auc"]["mean"] == pytest.approx(0.9085)
    assert sparse["auc_delta_vs_dense"]["mean"] == pytest.approx(-0.0015)
    assert sparse["average_precision_delta_vs_dense"]["mean"] == pytest.approx(-0.005)
    assert sparse["average_precision_delta_vs_dense"]["std"] == pytest.approx(0.00707107, rel=1e-5)  # of -0.01, 0
    assert goal_met(sparse)
    assert not goal_met(table["lossy"])  # AP 0.035 below dense
    assert not goal_met(table["dense"])  # no fewer bytes
