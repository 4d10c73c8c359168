"""Validation metrics of a scored split, whole or sampled (every fraud and a share of the genuine rows)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.training.config import OptimConfig
from pipeline.training.evaluate import ScoredSplit, split_metrics
from pipeline.training.loss import make_loss


def _scored(logits: np.ndarray, labels: np.ndarray) -> ScoredSplit:
    n = len(labels)
    ids = np.array([f"t{i}" for i in range(n)])
    return ScoredSplit(logits.astype(np.float32), labels.astype(np.int64), ids, np.full(n, "2026-01-01"), ids,
                       np.zeros(n, "datetime64[us]"))


def test_a_sampled_validation_scores_as_the_split_its_genuine_rows_stand_for():
    """Metrics of a sample at rate 1/4 equal those of the split where each sampled genuine row is there
    four times: each stands for 1 / rate rows."""
    rng = np.random.default_rng(3)
    labels = (rng.random(400) < 0.1).astype(np.int64)
    logits = rng.normal(size=400) + 2.0 * labels
    genuine = np.flatnonzero(labels == 0)
    expanded = np.concatenate([np.flatnonzero(labels == 1), np.repeat(genuine, 4)])
    loss = make_loss(OptimConfig(), 1, 1)
    sampled = split_metrics(_scored(logits, labels), loss, negative_rate=0.25)
    whole = split_metrics(_scored(logits[expanded], labels[expanded]), loss)
    for key in ("val_loss", "auc_roc", "average_precision", "recall_at_1pct_fpr"):
        assert sampled[key] == pytest.approx(whole[key], rel=1e-6), key
    assert sampled["validation_negative_rate"] == 0.25
    # card precision@100 and ECE need every row: a sample does not report them
    assert "card_precision_at_100" not in sampled and "ece" not in sampled
    assert sampled["average_precision"] != pytest.approx(split_metrics(_scored(logits, labels), loss)["average_precision"])
