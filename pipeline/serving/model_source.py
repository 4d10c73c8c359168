"""Where the scorer's models come from: the seam between the service and the registry.

:class:`ModelSource` is the interface the reloader uses (which version an alias names, and the
model of a version). :class:`RegistryModelSource` is the one implementation: the configured MLflow
registry (``registry.toml`` / ``$MLFLOW_TRACKING_URI``) and the configured model name only. URIs
are built here from a version number, never taken from a request, so an admin call can pick a
version but not another registry, model or path.

Loading never unpickles and never runs code shipped with the model: the version's artifacts are
downloaded, the ``model_dir`` artifact is located through the MLmodel file (parsed with
``yaml.safe_load``) and read by :func:`models.fraud_mlp.load_model` (safetensors tensors + JSON),
with the version's operating points beside the weights (``operating_points.json``, plain JSON, by
:func:`pipeline.decisions.operating_points.read_operating_points`). The pyfunc wrapper and its code
directory are ignored. A version without operating points is fetched (what serves it then is
serving.toml's choice, :mod:`pipeline.serving.thresholds`); a corrupt file refuses the version.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import mlflow
import yaml
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from models.fraud_mlp import CONFIG_FILE, WEIGHTS_FILE, FraudModel, load_model
from pipeline.decisions.operating_points import OPERATING_POINTS_FILE, OperatingPoints, read_operating_points
from pipeline.registry.config import RegistryConfig
from pipeline.registry.errors import ModelLoadError
from pipeline.registry.model_package import MODEL_DIR_ARTIFACT
from pipeline.registry.store import connect, version_by_alias, version_uri

PYFUNC_FLAVOR = "python_function"


@dataclass(frozen=True)
class FetchedVersion:
    """What a registered version ships for serving."""

    model: FraudModel  # in eval mode
    operating_points: OperatingPoints | None  # None: packaged before operating points existed


class ModelSource(Protocol):
    model_name: str

    def alias_version(self, alias: str) -> int | None:
        """The version ``alias`` points at, or None when it points nowhere."""

    def fetch(self, version: int) -> FetchedVersion:
        """The model and operating points of ``version``; raises ModelLoadError when it cannot be had
        (a corrupt operating-points file included)."""


class RegistryModelSource:
    """Versions of ``config.model_name`` in the configured registry (connects on first use)."""

    def __init__(self, config: RegistryConfig) -> None:
        self.config = config
        self.model_name = config.model_name
        self._client: MlflowClient | None = None

    def _connected(self) -> MlflowClient:
        if self._client is None:
            self._client = connect(self.config)  # TrackingUnavailable names the URI to fix
        return self._client

    def alias_version(self, alias: str) -> int | None:
        version = version_by_alias(self._connected(), self.model_name, alias)
        return int(version.version) if version else None

    def fetch(self, version: int) -> FetchedVersion:
        self._connected()
        uri = version_uri(self.model_name, version)
        with tempfile.TemporaryDirectory(prefix="fraud-serving-") as tmp:
            try:
                local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp))
            except MlflowException as exc:
                raise ModelLoadError(f"cannot download {uri} from the registry ({exc.message}); check that the "
                                     "version exists (`fraudctl history`) and its artifacts are readable") from exc
            directory = model_directory(local, uri)
            try:
                model = load_model(directory)
            except Exception as exc:  # safetensors, JSON and shape errors all mean "corrupt model"
                raise ModelLoadError(f"{uri}: the model files are corrupt ({type(exc).__name__}: {exc}); "
                                     "re-register the training run or roll back") from exc
            try:
                points = read_operating_points(directory)
            except ValueError as exc:  # a damaged package is not "no thresholds": never guess them
                raise ModelLoadError(f"{uri}: its {OPERATING_POINTS_FILE} is corrupt ({exc}); re-register the "
                                     "training run or roll back") from exc
            return FetchedVersion(model, points)


def model_directory(local: Path, uri: str) -> Path:
    """The safetensors model directory inside a downloaded pyfunc, found via its MLmodel file."""
    try:
        meta = yaml.safe_load((local / "MLmodel").read_text())
        relative = meta["flavors"][PYFUNC_FLAVOR]["artifacts"][MODEL_DIR_ARTIFACT]["path"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{uri} is not a fraud-model pyfunc (no {MODEL_DIR_ARTIFACT} artifact in its MLmodel: "
                             f"{type(exc).__name__}: {exc}); was it registered by `fraudctl register`?") from exc
    directory = (local / str(relative)).resolve()
    if not directory.is_relative_to(local.resolve()):
        raise ModelLoadError(f"{uri}: its MLmodel points outside the model ({relative!r}); refusing to read it")
    missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not (directory / name).is_file()]
    if missing:
        raise ModelLoadError(f"{uri}: {MODEL_DIR_ARTIFACT} lacks {missing}; re-register the training run")
    return directory
