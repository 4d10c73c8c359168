"""The model file: forward contract, normalisation inside, save/load without pickle."""

from __future__ import annotations

import dataclasses
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
from pipeline.serving.scorer import traced_logit
from pipeline.training.calibration import Calibration, apply_calibration

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


PLE_CONFIG = FraudModelConfig(("amount", "velocity"), {"mcc": 6}, embedding_dim=3, hidden_dim=16, num_blocks=1,
                              dropout=0.0, numeric_bins=3, numeric_embedding_dim=4, ensemble_size=3)
PLE_EDGES = torch.tensor([[0.0, 10.0, 100.0, 1000.0], [0.0, 1.0, 2.0, 2.0]])


def test_members_give_their_own_logits_and_the_model_scores_their_mean():
    torch.manual_seed(0)
    model = FraudModel(PLE_CONFIG).eval()
    x, c = _inputs()
    members = model(x, c[:, :1], per_member=True)
    assert members.shape == (8, 3)
    assert not torch.allclose(members[:, 0], members[:, 1])  # the adapters make members differ
    torch.testing.assert_close(model(x, c[:, :1]), members.mean(-1))


def test_bin_edges_shape_the_output_and_survive_save_and_load(tmp_path):
    torch.manual_seed(0)
    model = FraudModel(PLE_CONFIG).eval()
    x = torch.tensor([[5.0, 0.5], [500.0, 0.5], [float("nan"), float("inf")]])
    c = torch.zeros(3, 1, dtype=torch.int64)
    before = model(x, c)
    model.set_bin_edges(PLE_EDGES)
    after = model(x, c)
    assert torch.isfinite(after).all() and not torch.allclose(before[:2], after[:2])
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert torch.equal(loaded.numeric_embedding.encoding.bin_edges, PLE_EDGES)
    torch.testing.assert_close(loaded.predict_proba(x, c), model.predict_proba(x, c), rtol=0, atol=0)


def test_calibration_folds_into_every_members_bias():
    torch.manual_seed(0)
    model = FraudModel(PLE_CONFIG).eval()
    x, c = _inputs()
    raw = model(x, c[:, :1])
    apply_calibration(model, Calibration(temperature=2.0, logit_shift=-1.5))
    torch.testing.assert_close(model.predict_proba(x, c[:, :1]), torch.sigmoid((raw - 1.5) / 2.0))


def test_a_model_without_bins_refuses_edges():
    with pytest.raises(ValueError, match="numeric_bins = 0"):
        FraudModel(CONFIG).set_bin_edges(torch.zeros(2, 2))


def test_a_config_saved_before_bins_and_members_loads_as_the_original_architecture():
    legacy = {k: v for k, v in json.loads(CONFIG.to_json()).items()
              if k not in ("numeric_bins", "numeric_embedding_dim", "ensemble_size")}
    model = FraudModel(FraudModelConfig.from_json(json.dumps(legacy)))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    # The parameter names and shapes of the model before numeric bins and members existed.
    assert shapes == {
        "num_mean": (2,), "num_std": (2,), "temperature": (),
        "embeddings.0.weight": (6, 3), "embeddings.1.weight": (3, 3),
        "input.weight": (16, 2 + 2 * 3), "input.bias": (16,),
        **{f"blocks.{i}.{name}": shape for i in range(2) for name, shape in (
            ("norm.weight", (16,)), ("norm.bias", (16,)), ("fc1.weight", (32, 16)), ("fc1.bias", (32,)),
            ("fc2.weight", (16, 32)), ("fc2.bias", (16,)))},
        "head.0.weight": (16,), "head.0.bias": (16,), "head.1.weight": (1, 16), "head.1.bias": (1,),
    }


# Two steps of (gap, same merchant), step 1 the latest, scattered among the other columns.
SEQ_NUMERIC = ("p2_gap", "amount", "p1_gap", "p1_same", "velocity", "p2_same")
SEQ_CONFIG = FraudModelConfig(SEQ_NUMERIC, {"mcc": 6}, embedding_dim=3, hidden_dim=16, num_blocks=1, dropout=0.0,
                              sequence_columns=("p1_gap", "p1_same", "p2_gap", "p2_same"), sequence_steps=2,
                              sequence_hidden=5)


def _seq_inputs(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(n, len(SEQ_NUMERIC), generator=gen) * 3, torch.randint(0, 6, (n, 1), generator=gen)


def test_the_sequence_encoder_runs_its_gru_over_the_steps_oldest_first():
    torch.manual_seed(0)
    model = FraudModel(SEQ_CONFIG).eval()
    z, _ = _seq_inputs()
    col = {name: i for i, name in enumerate(SEQ_NUMERIC)}
    oldest_first = torch.stack([z[:, [col["p2_gap"], col["p2_same"]]], z[:, [col["p1_gap"], col["p1_same"]]]], dim=1)
    _, expected = model.sequence.gru(oldest_first)
    torch.testing.assert_close(model.sequence(z), expected[0], rtol=0, atol=0)
    other = z.clone()
    other[:, [col["amount"], col["velocity"]]] += 5.0  # not sequence columns: the GRU does not read them
    torch.testing.assert_close(model.sequence(other), model.sequence(z), rtol=0, atol=0)


def test_the_sequence_branch_adds_a_gru_to_the_mlp_input_and_trains_it():
    torch.manual_seed(0)
    plain = FraudModel(FraudModelConfig(SEQ_NUMERIC, {"mcc": 6}, embedding_dim=3, hidden_dim=16, num_blocks=1))
    model = FraudModel(SEQ_CONFIG)
    hidden, fields = 5, 2
    gru = 3 * (hidden * fields + hidden * hidden + 2 * hidden)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(model) - count(plain) == gru + 16 * hidden  # the GRU, and its width more input columns
    assert model.input.weight.shape == (16, len(SEQ_NUMERIC) + 3 + hidden)
    x, c = _seq_inputs()
    model(x, c).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.sequence.gru.parameters())


def test_a_sequence_column_reaches_the_logit_through_the_gru():
    torch.manual_seed(0)
    model = FraudModel(SEQ_CONFIG).eval()
    with torch.no_grad():  # cut every column's direct path: what is left is the GRU's
        model.input.weight[:, : len(SEQ_NUMERIC)] = 0.0
    x, c = _seq_inputs()
    moved, other = x.clone(), x.clone()
    moved[:, SEQ_NUMERIC.index("p2_same")] += 3.0
    other[:, SEQ_NUMERIC.index("amount")] += 3.0
    assert (model(moved, c) - model(x, c)).abs().min() > 1e-4
    torch.testing.assert_close(model(other, c), model(x, c), rtol=0, atol=0)


def test_a_sequence_model_survives_save_and_load(tmp_path):
    torch.manual_seed(0)
    model = FraudModel(SEQ_CONFIG).eval()
    model.set_normalization(torch.linspace(-1.0, 1.0, 6), torch.linspace(0.5, 2.0, 6))
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert loaded.config == SEQ_CONFIG and isinstance(loaded.config.sequence_columns, tuple)
    x, c = _seq_inputs()
    torch.testing.assert_close(loaded(x, c), model(x, c), rtol=0, atol=0)


def test_a_config_saved_before_the_sequence_branch_loads_without_it():
    legacy = {k: v for k, v in json.loads(CONFIG.to_json()).items()
              if k not in ("sequence_columns", "sequence_steps", "sequence_hidden")}
    config = FraudModelConfig.from_json(json.dumps(legacy))
    assert config == CONFIG
    model = FraudModel(config)
    assert model.sequence is None and not any(k.startswith("sequence") for k in model.state_dict())


@pytest.mark.parametrize(("change", "needle"), [
    ({"sequence_columns": ("p1_gap", "p1_same", "p2_gap", "missing")}, "not among numeric_features: \\['missing'\\]"),
    ({"sequence_steps": 3}, "do not split into sequence_steps = 3"),
    ({"sequence_steps": 0}, "do not split into sequence_steps = 0"),
    ({"sequence_columns": ()}, "needs sequence_columns"),
    ({"sequence_hidden": -1}, "must be >= 0"),
])
def test_an_invalid_sequence_config_is_refused_by_name(change, needle):
    with pytest.raises(ValueError, match=needle):
        FraudModel(dataclasses.replace(SEQ_CONFIG, **change))


def test_the_traced_sequence_model_scores_like_the_eager_one():
    torch.manual_seed(0)
    model = FraudModel(dataclasses.replace(SEQ_CONFIG, numeric_bins=3, numeric_embedding_dim=4, ensemble_size=3))
    model.set_bin_edges(torch.tensor([[-3.0, -1.0, 1.0, 3.0]] * len(SEQ_NUMERIC)))
    model.eval()
    graph = traced_logit(model)
    x, c = _seq_inputs(5)  # not the traced example's batch size
    x[1, SEQ_NUMERIC.index("p1_gap")] = float("nan")
    with torch.inference_mode():
        torch.testing.assert_close(graph(x, c), model.calibrated_logit(x, c), rtol=0, atol=1e-5)
        torch.testing.assert_close(graph(x[:1], c[:1]), model.calibrated_logit(x[:1], c[:1]), rtol=0, atol=1e-5)
