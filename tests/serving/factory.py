"""Models on the service's real features, registered the way `fraudctl register` registers them.

:func:`simulated_window` simulates a small portfolio (the project's simulator) and builds its feature
rows with the frame builder (the kernel the Spark job uses); :func:`train_model` fits a tiny
FraudModel on them with plain torch in about a second; :func:`log_model` logs a model as the pyfunc
the registry stores (safetensors inside, and the operating points a finalised run ships, or none, or
a damaged file) and :func:`register` makes a version of it. :func:`choose_points` chooses a model's
operating points from a budget with the function finalising a run uses.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass
from pathlib import Path

import mlflow
import pandas as pd
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, frame_to_tensors, save_model
from pipeline.decisions.operating_points import (
    OPERATING_POINTS_FILE,
    DecisionBudget,
    OperatingPoints,
    choose_operating_points,
    write_operating_points,
)
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.features.params import FeatureParams
from pipeline.registry.config import RegistryConfig
from pipeline.registry.model_package import log_pyfunc_model, register_version
from pipeline.registry.store import connect, ensure_experiment
from pipeline.simulation import SimulationConfig, simulate

PARAMS = FeatureParams(label_delay_hours=24.0, label_match_days=90)


@dataclass(frozen=True)
class Window:
    transactions: pd.DataFrame  # contract columns, event_time as RFC 3339 strings
    labels: pd.DataFrame
    features: pd.DataFrame  # build_feature_frame rows plus "label" (ground truth)


def simulated_window(days: int = 8, num_cards: int = 400, start_date: str = "2026-03-01", seed: int = 5) -> Window:
    sim = simulate(SimulationConfig(seed=seed, start_date=start_date, days=days, num_cards=num_cards,
                                    num_merchants=100, fraud_rate=0.03))
    features = build_feature_frame(sim.transactions, sim.labels, PARAMS)
    features["label"] = sim.truth["is_fraud"].astype(int).to_numpy()
    return Window(sim.transactions, sim.labels, features)


def train_model(features: pd.DataFrame, steps: int = 60, seed: int = 0) -> FraudModel:
    """Full-batch Adam on every row: a real model of the current feature schema, tiny and fast."""
    torch.manual_seed(seed)
    config = FraudModelConfig(numeric_features=fd.NUMERIC_FEATURES, categorical_features=dict(fd.CATEGORICAL_FEATURES),
                              embedding_dim=4, hidden_dim=16, num_blocks=1, dropout=0.0,
                              sequence_columns=fd.SEQUENCE_FEATURES, sequence_steps=fd.SEQUENCE_STEPS, sequence_hidden=4)
    model = FraudModel(config)
    numeric, categorical = frame_to_tensors(features, config)
    squashed = torch.sign(numeric) * torch.log1p(numeric.abs())
    model.set_normalization(squashed.mean(0), squashed.std(0))
    labels = torch.tensor(features["label"].to_numpy(), dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(numeric, categorical), labels).backward()
        optimizer.step()
    return model.eval()


def with_nan_output(model: FraudModel) -> FraudModel:
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.head[1].bias.fill_(float("nan"))
    return out


def with_shifted_logits(model: FraudModel, shift: float) -> FraudModel:
    """The same ranking, another score distribution: every logit moved by ``shift``."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.head[1].bias.add_(shift)
    return out


def log_model(config: RegistryConfig, model: FraudModel, points: OperatingPoints | None = None,
              points_text: str | None = None) -> str:
    """Log ``model`` as the registry's pyfunc (seconds: do it once per module); returns its model URI.

    ``points``: shipped as ``operating_points.json`` in the model directory, as a finalised run does;
    ``points_text``: that file with this text instead (a damaged package); neither: a model packaged
    before operating points existed."""
    client = connect(config)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "model"
        save_model(model, model_dir)
        if points is not None:
            write_operating_points(model_dir, points)
        if points_text is not None:
            (model_dir / OPERATING_POINTS_FILE).write_text(points_text)
        with mlflow.start_run(experiment_id=ensure_experiment(client, config)):
            return log_pyfunc_model(model_dir).model_uri


def register(config: RegistryConfig, model_uri: str, points: OperatingPoints | None = None) -> int:
    """A new version of ``config.model_name`` from a logged model (milliseconds), no alias set; with
    ``points``, tagged with them as `fraudctl register` tags a version."""
    tags = {"source": "tests/serving", **(points.tags() if points is not None else {})}
    return register_version(config.model_name, model_uri, tags)


def scores_of(model: FraudModel, features: pd.DataFrame) -> list[float]:
    """The model's probabilities for feature rows, through the training-side tensor path."""
    numeric, categorical = frame_to_tensors(features, model.config)
    return model.predict_proba(numeric, categorical).tolist()


def choose_points(model: FraudModel, features: pd.DataFrame, budget: DecisionBudget) -> OperatingPoints:
    """``model``'s operating points for ``budget``, chosen on ``features`` (with their ``label``) as
    finalising a run chooses them on its validation split."""
    return choose_operating_points(features["label"].to_numpy(), scores_of(model, features), budget)


def score_row(model: FraudModel, row: dict) -> float:
    """The model's probability for one feature row, through the training-side tensor path."""
    numeric, categorical = frame_to_tensors(pd.DataFrame([row]), model.config)
    return float(model.predict_proba(numeric, categorical)[0])
