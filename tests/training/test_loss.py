from __future__ import annotations

import math

import pytest
import torch

from pipeline.training.config import OptimConfig
from pipeline.training.loss import focal_loss, make_loss, positive_weight, weighted_bce


def test_auto_positive_weight_is_sqrt_of_imbalance():
    assert positive_weight(OptimConfig(pos_weight=0.0), positives=10, negatives=990) == pytest.approx(math.sqrt(99))
    assert positive_weight(OptimConfig(pos_weight=4.0), positives=10, negatives=990) == 4.0


def test_weighted_bce_weights_positive_terms():
    logits, labels = torch.tensor([0.3, -1.2]), torch.tensor([1.0, 0.0])
    expected = (-3.0 * math.log(torch.sigmoid(torch.tensor(0.3)).item())
                - math.log(1 - torch.sigmoid(torch.tensor(-1.2)).item())) / 2
    assert weighted_bce(logits, labels, 3.0).item() == pytest.approx(expected, rel=1e-5)


def test_focal_loss_reduces_to_half_bce_with_gamma_zero_and_alpha_half():
    logits, labels = torch.randn(64), (torch.rand(64) < 0.3).float()
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    assert focal_loss(logits, labels, gamma=0.0, alpha=0.5).item() == pytest.approx(0.5 * bce.item(), rel=1e-5)


def test_focal_loss_down_weights_easy_examples():
    easy = focal_loss(torch.tensor([6.0]), torch.tensor([1.0]), gamma=2.0, alpha=0.5)
    hard = focal_loss(torch.tensor([-2.0]), torch.tensor([1.0]), gamma=2.0, alpha=0.5)
    assert easy.item() < 1e-5 < hard.item()


def test_make_loss_selects_the_configured_kind():
    logits, labels = torch.randn(16), (torch.rand(16) < 0.5).float()
    focal = make_loss(OptimConfig(loss="focal", focal_gamma=0.0, focal_alpha=0.5), 1, 1)
    assert focal(logits, labels).item() == pytest.approx(focal_loss(logits, labels, 0.0, 0.5).item())
    bce = make_loss(OptimConfig(loss="weighted_bce", pos_weight=2.0), 1, 1)
    assert bce(logits, labels).item() == pytest.approx(weighted_bce(logits, labels, 2.0).item())


def test_importance_weights_of_a_negative_sample_are_the_unsampled_loss_up_to_scale():
    """positive_scale = rate: each kept genuine row weighs 1/rate against a fraud, so the loss on a
    sample is the unsampled loss (times rate) in expectation."""
    logits, labels = torch.tensor([0.3, -1.2, 0.5]), torch.tensor([1.0, 0.0, 0.0])
    scaled = make_loss(OptimConfig(pos_weight=2.0), 10, 990, positive_scale=0.1)(logits, labels)
    per_row = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    importance = torch.tensor([2.0, 1 / 0.1, 1 / 0.1])  # the fraud's own weight; genuine rows 1/rate
    assert scaled.item() == pytest.approx(0.1 * (importance * per_row).mean().item(), rel=1e-5)
