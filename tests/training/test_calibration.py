from __future__ import annotations

import pytest
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig
from pipeline.training.calibration import Calibration, apply_calibration, fit_calibration


def test_fit_recovers_a_known_scale_and_offset():
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(20_000, generator=gen) * 3
    true_p = torch.sigmoid(0.5 * z - 1.0)  # T = 2, shift = -2
    y = (torch.rand(20_000, generator=gen) < true_p).float()
    cal = fit_calibration(z, y)
    assert cal.temperature == pytest.approx(2.0, rel=0.05)
    assert cal.logit_shift == pytest.approx(-2.0, abs=0.15)


def test_apply_folds_calibration_into_the_model():
    torch.manual_seed(0)
    model = FraudModel(FraudModelConfig(("a", "b"), {"c": 5}, hidden_dim=8, num_blocks=1)).eval()
    x, c = torch.randn(10, 2), torch.randint(0, 5, (10, 1))
    raw = model(x, c)
    apply_calibration(model, Calibration(temperature=2.5, logit_shift=-1.5))
    torch.testing.assert_close(model.predict_proba(x, c), torch.sigmoid((raw - 1.5) / 2.5))


def test_one_class_validation_leaves_scores_unchanged():
    assert fit_calibration(torch.randn(100), torch.zeros(100)) == Calibration(1.0, 0.0)
