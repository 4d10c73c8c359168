"""Scoring-service fixtures: a real MLflow SQLite registry with real models, and the service on it.

The registry fixtures are the registry tests' own (``world``: a state dir and store per module;
``config``: a registered model name per test; ``trained``: models of an *older* feature schema,
which the service must refuse). Models of the current schema are trained once per session on a
simulated window and logged once per module; each test registers its own versions from those
logs in milliseconds, so aliases never leak between tests. ``logged`` models ship no operating
points (packaged before they existed); ``shipped`` ones do (``SHIPPED_BUDGET``), or a damaged file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from fastapi import FastAPI
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from models.fraud_mlp import FraudModel
from pipeline.decisions.operating_points import DecisionBudget, OperatingPoints
from pipeline.features.frame import build_feature_frame
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from pipeline.registry.store import CHAMPION
from pipeline.serving.app import create_app
from pipeline.serving.config import AdminConfig, ModelConfig, RulesConfig, ServingConfig, StreamConfig
from pipeline.serving.service import ScoringService, build_service
from tests.registry.conftest import World, client, config, trained, world  # noqa: F401  (shared registry fixtures)
from tests.serving import factory

ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    torch.set_num_threads(1)  # tiny models on a shared 2-core machine: threads only contend


@pytest.fixture(scope="session")
def window() -> factory.Window:
    return factory.simulated_window()


@dataclass(frozen=True)
class Models:
    good: FraudModel
    other: FraudModel  # same schema, different weights: its scores differ from good's


@pytest.fixture(scope="session")
def models(window: factory.Window) -> Models:
    return Models(factory.train_model(window.features, steps=60, seed=0),
                  factory.train_model(window.features, steps=20, seed=1))


@dataclass(frozen=True)
class Logged:
    good: str  # model URIs of logged pyfuncs, registered per test with factory.register
    other: str
    stale: str  # a model of another feature schema
    broken: str  # current schema, NaN scores


@pytest.fixture(scope="module")
def logged(world: World, models: Models, trained) -> Logged:  # noqa: F811
    base = RegistryConfig(model_name="fd-serving-logs")
    return Logged(factory.log_model(base, models.good), factory.log_model(base, models.other),
                  factory.log_model(base, trained.good), factory.log_model(base, factory.with_nan_output(models.good)))


# Large enough shares that a few thousand payments measure them: flag the top 10%, block the top 2%.
SHIPPED_BUDGET = DecisionBudget(review_rate=0.1, block_precision=0.0, block_rate=0.02)
SHIFT = 2.0  # logits: the shifted model ranks as good does, with much higher scores


@pytest.fixture(scope="session")
def online_features(window: factory.Window) -> pd.DataFrame:
    """The window's feature rows as a service that saw no fraud reports computes them (every payment
    scored in event-time order), with the truth as ``label``."""
    rows = build_feature_frame(window.transactions, window.labels.head(0), factory.PARAMS)
    truth = window.features.set_index("transaction_id")["label"]
    return rows.assign(label=truth.loc[rows["transaction_id"]].to_numpy())


@dataclass(frozen=True)
class Shipped:
    """Logged models that ship operating points (chosen for SHIPPED_BUDGET on every other online row)."""

    good: str
    good_points: OperatingPoints
    shifted: str  # good with SHIFT on its logits, and its own operating points
    shifted_points: OperatingPoints
    shifted_with_good_points: str  # operating points that do not fit its scores: flags far more than the budget
    corrupt: str  # good, with an operating_points.json that is not JSON


@pytest.fixture(scope="module")
def shipped(world: World, models: Models, online_features: pd.DataFrame) -> Shipped:  # noqa: F811
    base = RegistryConfig(model_name="fd-serving-shipped")
    shifted = factory.with_shifted_logits(models.good, SHIFT)
    validation = online_features.iloc[::2]
    good_points = factory.choose_points(models.good, validation, SHIPPED_BUDGET)
    shifted_points = factory.choose_points(shifted, validation, SHIPPED_BUDGET)
    return Shipped(factory.log_model(base, models.good, good_points), good_points,
                   factory.log_model(base, shifted, shifted_points), shifted_points,
                   factory.log_model(base, shifted, good_points),
                   factory.log_model(base, models.good, points_text='{"review_threshold": 0.1, "block_thr'))


@pytest.fixture
def champion(config: RegistryConfig, client: MlflowClient, logged: Logged) -> int:  # noqa: F811
    """Version 1 (the good model) registered and made champion."""
    version = factory.register(config, logged.good)
    client.set_registered_model_alias(config.model_name, CHAMPION, str(version))
    return version


@pytest.fixture
def serving_config(tmp_path: Path) -> ServingConfig:
    """Fast polls, rules in the test's tmp dir, an admin token; no Kafka (tests that want it add it)."""
    return ServingConfig(model=ModelConfig(poll_interval_s=0.1, warmup_rows=8, explain_min_score=0.0),
                         rules=RulesConfig(path=str(tmp_path / "rules.toml"), refresh_interval_s=0.1),
                         stream=StreamConfig(seed_from_raw_store=False, consume=False),
                         admin=AdminConfig(token=ADMIN_TOKEN))


ServiceFactory = Callable[..., ScoringService]


@pytest.fixture
def make_service(config: RegistryConfig) -> ServiceFactory:  # noqa: F811
    def make(serving: ServingConfig, kafka: KafkaConfig | None = None, raw_root: Path | None = None,
             registry: RegistryConfig | None = None, clock: Callable[[], float] = time.monotonic) -> ScoringService:
        return build_service(serving, registry or config, factory.PARAMS, kafka, raw_root, clock)
    return make


def app_of(service: ScoringService) -> FastAPI:
    return create_app(service, service.config.server, service.config.admin)


@pytest.fixture
def http(serving_config: ServingConfig, make_service: ServiceFactory, champion: int) -> Iterator[TestClient]:
    """The app on the champion (started and stopped by its lifespan), through FastAPI's test client."""
    with TestClient(app_of(make_service(serving_config))) as test_client:
        yield test_client


def event(row: dict) -> dict:
    """A simulated transaction as the contract's JSON object (absent optional fields left out)."""
    return {k: v for k, v in row.items() if v is not None}


def with_decision(serving: ServingConfig, **thresholds: float) -> ServingConfig:
    return replace(serving, decision=replace(serving.decision, **thresholds))


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
