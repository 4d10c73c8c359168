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
from pipeline.registry.config import GateConfig, Guardrail, RegistryConfig
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


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("registry")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRAUD_STATE_DIR", str(tmp / "state"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        root = tmp / "dataset"
        manifest = factory.write_dataset(root)
        good = factory.train_model(root, manifest)
        weak = factory.train_model(root, manifest, rows=150, steps=30)
        yield World(tmp, tmp / "state", root, manifest, good, weak)


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
