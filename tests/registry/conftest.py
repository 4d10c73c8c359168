"""Registry test fixtures: one MLflow SQLite store, dataset and set of trained models per module.

MLflow imports and store creation cost seconds, so a module shares them; each test still gets its
own registered model name (and so its own aliases, audit history and lock), which keeps tests
independent while they share the store.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from mlflow import MlflowClient

from models.fraud_mlp import FraudModel
from pipeline.datasets.manifest import DatasetManifest
from pipeline.evaluation.config import GateConfig, Guardrail
from pipeline.registry.config import RegistryConfig
from pipeline.registry.store import connect
from tests.registry import factory


@dataclass
class World:
    tmp: Path
    state: Path
    root: Path  # dataset root
    manifest: DatasetManifest
    good: FraudModel
    weak: FraudModel

    def run_dir(self, name: str, model: FraudModel) -> Path:
        return factory.write_run_dir(self.tmp / "runs" / name, model, self.root, self.manifest)


# Thresholds the factory's models are known to sit on the right side of; PSI warns because the
# tiny models' score distributions differ a lot even when their ranking is similar.
TEST_GATE = GateConfig(first_model_auc_floor=0.7, psi_limit=Guardrail(0.25, "warn"),
                       min_holdout_frauds=Guardrail(30, "block"), ece_limit=Guardrail(0.1, "block"))


@dataclass(frozen=True)
class Trained:
    root: Path
    manifest: DatasetManifest
    good: FraudModel
    weak: FraudModel


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """The dataset and the two trained models: read-only, so shared by every registry test module."""
    root = tmp_path_factory.mktemp("registry-dataset")
    manifest = factory.write_dataset(root)
    return Trained(root, manifest, factory.train_model(root, manifest),
                   factory.train_model(root, manifest, rows=150, steps=30))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, trained: Trained) -> Iterator[World]:
    """A fresh state dir (so a fresh MLflow store) for the module, with the shared dataset and models."""
    tmp = tmp_path_factory.mktemp("registry")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRAUD_STATE_DIR", str(tmp / "state"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        yield World(tmp, tmp / "state", trained.root, trained.manifest, trained.good, trained.weak)


@pytest.fixture
def config(world: World, request: pytest.FixtureRequest) -> RegistryConfig:
    """Embedded store of the module; a registered model name unique to this test."""
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[-60:]
    return replace(RegistryConfig(), model_name=f"fd-{name}", gate=TEST_GATE, lock_timeout_s=60.0)


@pytest.fixture
def client(config: RegistryConfig) -> MlflowClient:
    return connect(config)


def version_artifact_dir(client: MlflowClient, model_name: str, version: int) -> Path:
    """Local directory of a registered version's pyfunc artifacts (embedded store)."""
    source = client.get_model_version(model_name, str(version)).source  # models:/m-<id>
    logged = client.get_logged_model(source.removeprefix("models:/"))
    return Path(logged.artifact_location.removeprefix("file://"))
