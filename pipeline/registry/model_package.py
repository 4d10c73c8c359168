"""Turn a saved FraudModel directory into a registered MLflow pyfunc version.

The pyfunc is logged as "models from code" (``pyfunc_model.py`` is copied, not pickled) with the
``models`` package as its code path, so a scoring host needs only the pinned requirements, not
this project. The model directory (safetensors weights + JSON config, normalisation and
temperature inside) is the single artifact. The signature lists every raw feature column
(numerics as double, categorical codes as long) so a dataset that lacks one is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import mlflow
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema

import models
from models.fraud_mlp import FraudModel, FraudModelConfig, load_model
from pipeline.registry.errors import RunDirError

PYFUNC_MODEL_FILE = Path(__file__).with_name("pyfunc_model.py")
MODELS_PACKAGE_DIR = Path(models.__file__).parent
MODEL_DIR_ARTIFACT = "model_dir"  # the key pyfunc_model.py reads from context.artifacts
MODEL_ARTIFACT_NAME = "model"
OUTPUT_COLUMN = "fraud_probability"
# What the pyfunc imports at load time; pinned to this environment's versions.
RUNTIME_PACKAGES = ("mlflow", "torch", "safetensors", "numpy", "pandas", "lightgbm")  # lightgbm: a blend's booster


def feature_columns(numeric: Iterable[str], categorical: Iterable[str]) -> list[ColSpec]:
    """The raw feature columns as MLflow sees them: numerics as double, categorical codes as long."""
    return [ColSpec("double", name) for name in numeric] + [ColSpec("long", name) for name in categorical]


def model_signature(config: FraudModelConfig) -> ModelSignature:
    inputs = feature_columns(config.numeric_features, config.categorical_features)
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([ColSpec("double", OUTPUT_COLUMN)]))


def input_example(model: FraudModel) -> pd.DataFrame:
    """Two raw rows built from the model itself: the training mean, and mean + 1 std with code 1.

    Derived from the saved normalisation statistics so it exists even when the dataset has since
    been pruned, and it exercises both a typical and an off-centre row.
    """
    config = model.config
    mean = model.num_mean.detach().cpu().numpy().astype(float)
    std = model.num_std.detach().cpu().numpy().astype(float)
    rows: dict[str, list] = {name: [mean[i], mean[i] + std[i]] for i, name in enumerate(config.numeric_features)}
    for name, cardinality in config.categorical_features.items():
        rows[name] = [0, min(1, cardinality - 1)]
    return pd.DataFrame(rows)


def pinned_requirements() -> list[str]:
    pins = []
    for package in RUNTIME_PACKAGES:
        try:
            pins.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            pins.append(package)
    # The CPU torch wheel's local version tag (+cpu) is not on PyPI; pin the release only.
    return [p.split("+")[0] for p in pins]


def load_saved_model(model_dir: Path) -> FraudModel:
    """Load the model directory, turning unreadable weights/config into a RunDirError."""
    try:
        return load_model(Path(model_dir))
    except Exception as exc:  # safetensors, JSON and shape errors all mean "corrupt model"
        raise RunDirError(f"model in {model_dir} cannot be loaded ({type(exc).__name__}: {exc})") from exc


def log_pyfunc_model(model_dir: Path) -> mlflow.models.model.ModelInfo:
    """Log ``model_dir`` as the pyfunc ``model`` of the active MLflow run."""
    model = load_saved_model(model_dir)
    with torch.no_grad():
        return mlflow.pyfunc.log_model(
            name=MODEL_ARTIFACT_NAME,
            python_model=str(PYFUNC_MODEL_FILE),
            artifacts={MODEL_DIR_ARTIFACT: str(Path(model_dir).resolve())},
            code_paths=[str(MODELS_PACKAGE_DIR)],
            signature=model_signature(model.config),
            input_example=input_example(model),
            pip_requirements=pinned_requirements(),
        )


def register_version(model_name: str, model_uri: str, tags: dict[str, str]) -> int:
    """Create a new version of ``model_name`` from a logged model URI (registered model created on
    first use); MLflow links the version to its source run and logged model."""
    version = mlflow.register_model(model_uri, model_name, tags=tags)
    return int(version.version)
