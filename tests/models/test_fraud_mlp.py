"""The model file: forward contract, normalisation inside, save/load without pickle."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from models.fraud_mlp import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    FraudModel,
    FraudModelConfig,
    frame_to_tensors,
    load_model,
    save_model,
    squash,
)

CONFIG = FraudModelConfig(("amount", "velocity"), {"mcc": 6, "country": 3}, embedding_dim=3, hidden_dim=16,
                          num_blocks=2, dropout=0.0)


def _inputs(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, 2, generator=gen), torch.randint(0, 3, (n, 2), generator=gen)


def test_forward_gives_one_logit_per_row():
    model = FraudModel(CONFIG)
    x, c = _inputs()
    assert model(x, c).shape == (8,)


def test_non_finite_inputs_and_unknown_codes_give_finite_logits():
    model = FraudModel(CONFIG)
    x, c = _inputs(4)
    x[0, 0], x[1, 1], x[2, 0] = float("nan"), float("inf"), -float("inf")
    c[3, 0] = 999  # beyond cardinality: clamped
    assert torch.isfinite(model(x, c)).all()


def test_normalisation_is_applied_inside_and_constant_columns_are_safe():
    model = FraudModel(CONFIG).eval()
    x, c = _inputs()
    model.set_normalization(torch.tensor([10.0, -1.0]), torch.tensor([2.0, 0.0]))
    assert model.num_std.tolist() == [2.0, 1.0]
    reference = FraudModel(CONFIG).eval()
    reference.load_state_dict(model.state_dict())
    reference.set_normalization(torch.zeros(2), torch.ones(2))
    shifted = (squash(x) - torch.tensor([10.0, -1.0])) / torch.tensor([2.0, 1.0])
    unsquashed = torch.sign(shifted) * torch.expm1(shifted.abs())  # squash(unsquashed) == shifted
    torch.testing.assert_close(model(x, c), reference(unsquashed, c))


def test_squash_is_a_monotone_odd_signed_log():
    x = torch.tensor([-1e6, -(torch.e - 1), -0.5, 0.0, 0.5, torch.e - 1, 1e6], dtype=torch.float64)
    y = squash(x)
    assert torch.all(y[1:] > y[:-1])
    torch.testing.assert_close(y, -squash(-x))
    torch.testing.assert_close(y[[1, 3, 5]], torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))


def test_temperature_scales_probabilities():
    model = FraudModel(CONFIG).eval()
    x, c = _inputs()
    logits = model(x, c)
    model.temperature.fill_(3.0)
    torch.testing.assert_close(model.predict_proba(x, c), torch.sigmoid(logits / 3.0))


def test_save_and_load_round_trip_without_pickle(tmp_path):
    torch.manual_seed(1)
    model = FraudModel(CONFIG)
    model.set_normalization(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]))
    model.temperature.fill_(1.7)
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    assert json.loads((tmp_path / "m" / CONFIG_FILE).read_text())["categorical_features"] == {"mcc": 6, "country": 3}
    loaded = load_model(tmp_path / "m")
    assert not loaded.training and loaded.config == CONFIG
    x, c = _inputs()
    torch.testing.assert_close(loaded.predict_proba(x, c), model.eval().predict_proba(x, c), rtol=0, atol=0)


def test_frame_to_tensors_maps_missing_values_and_names_absent_columns():
    frame = pd.DataFrame({"amount": [1.0, None], "velocity": [2, 3], "mcc": [4, None], "country": [1, 2]})
    numeric, categorical = frame_to_tensors(frame, CONFIG)
    assert numeric.dtype == torch.float32 and categorical.dtype == torch.int64
    assert np.isnan(numeric[1, 0].item()) and categorical[1, 0].item() == 0
    with pytest.raises(KeyError, match="country"):
        frame_to_tensors(frame.drop(columns=["country"]), CONFIG)
