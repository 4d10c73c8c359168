"""Load a model by URI and score raw dataset rows with it: shared by the gate and ``evaluate``.

Every failure becomes a named error: an unresolvable URI or missing/corrupt artifacts ->
ModelLoadError; a dataset without the model's signature columns, or of incompatible types ->
SignatureMismatch. Callers act only after scoring succeeded, so these never leave partial changes.
"""

from __future__ import annotations

from collections.abc import Collection

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PyFuncModel

from pipeline.registry.errors import ModelLoadError, SignatureMismatch


def load_scorer(model_uri: str) -> PyFuncModel:
    try:
        return mlflow.pyfunc.load_model(model_uri)
    except Exception as exc:  # resolution, download, MLmodel parsing and load_context errors alike
        raise ModelLoadError(
            f"cannot load model {model_uri} ({type(exc).__name__}: {exc}). Its artifacts are missing or "
            "corrupt, or the URI names no model: check `fraudctl history` / the registry, re-register the "
            "training run, or roll back."
        ) from exc


def input_columns(model: PyFuncModel, model_uri: str) -> list[str]:
    schema = model.metadata.get_input_schema()
    if schema is None or not schema.has_input_names():
        raise SignatureMismatch(f"model {model_uri} has no named input signature; it cannot score dataset rows")
    return list(schema.input_names())


def check_signature(model: PyFuncModel, model_uri: str, columns: Collection[str]) -> list[str]:
    """The model's input columns, after checking the dataset has every one of them."""
    wanted = input_columns(model, model_uri)
    missing = [c for c in wanted if c not in set(columns)]
    if missing:
        raise SignatureMismatch(
            f"model {model_uri} needs columns {missing} that the dataset does not have: the model and the "
            "dataset come from different feature versions; score it on a dataset built with its features"
        )
    return wanted


def score_rows(model: PyFuncModel, model_uri: str, frame: pd.DataFrame) -> np.ndarray:
    """Fraud probability per row of ``frame`` (float64; NaN where the model produced NaN)."""
    columns = check_signature(model, model_uri, frame.columns)
    try:
        out = model.predict(frame[columns])
    except MlflowException as exc:  # schema enforcement: wrong column types
        raise SignatureMismatch(f"model {model_uri} refused the dataset rows: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(f"model {model_uri} failed while scoring ({type(exc).__name__}: {exc})") from exc
    scores = np.asarray(out, dtype=np.float64).ravel()
    if scores.shape[0] != len(frame):
        raise ModelLoadError(f"model {model_uri} returned {scores.shape[0]} scores for {len(frame)} rows")
    return scores
