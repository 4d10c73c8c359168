"""Connection to the MLflow tracking store / model registry (the only place that points MLflow at it).

``connect`` resolves the URI, points the process-wide MLflow client at it (``mlflow.pyfunc.load_model``
and ``mlflow.start_run`` read the global URI), and proves the store answers, with a short HTTP
timeout and no retries, so an unreachable server fails in seconds with a clear message instead of
MLflow's default minutes of back-off.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import mlflow
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from pipeline.registry.config import RegistryConfig, artifact_location, resolved_tracking_uri
from pipeline.registry.errors import TrackingUnavailable

CHALLENGER = "challenger"
CHAMPION = "champion"
PREVIOUS_CHAMPION = "previous-champion"


@contextlib.contextmanager
def short_http_timeouts(timeout_s: int) -> Iterator[None]:
    """Within the block, MLflow HTTP calls time out after ``timeout_s`` and are not retried."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    saved = {k: os.environ.get(k) for k in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def connect(config: RegistryConfig) -> MlflowClient:
    """A client for the configured store, after checking it answers; raises TrackingUnavailable."""
    uri = resolved_tracking_uri(config)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    try:
        with short_http_timeouts(config.connect_timeout_s):
            client.search_experiments(max_results=1)
    except Exception as exc:  # requests, sqlalchemy and MLflow errors all mean "cannot use the store"
        raise TrackingUnavailable(
            f"MLflow tracking store {uri} is unreachable or unreadable ({type(exc).__name__}: {exc}). "
            "Check MLFLOW_TRACKING_URI / tracking_uri in conf/<env>/registry.toml and that the server is up; "
            "nothing was changed."
        ) from exc
    return client


def ensure_experiment(client: MlflowClient, config: RegistryConfig) -> str:
    """Id of the training experiment, created (with the local artifact root) on first use."""
    experiment = client.get_experiment_by_name(config.experiment_name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(config.experiment_name, artifact_location=artifact_location(config))
    except MlflowException:
        # Another process created it between our lookup and create.
        experiment = client.get_experiment_by_name(config.experiment_name)
        if experiment is None:
            raise
        return experiment.experiment_id


def version_uri(model_name: str, version: int) -> str:
    return f"models:/{model_name}/{version}"


def version_by_alias(client: MlflowClient, model_name: str, alias: str) -> ModelVersion | None:
    """The version an alias points at, or None when the alias (or the registered model) does not exist."""
    try:
        return client.get_model_version_by_alias(model_name, alias)
    except MlflowException as exc:
        # The SQL store answers a missing alias with INVALID_PARAMETER_VALUE, a server may use either.
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def model_exists(client: MlflowClient, model_name: str) -> bool:
    try:
        client.get_registered_model(model_name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise
    return True
