"""The set-up the serving benchmarks share (``bench scoring``, ``partitions``, ``soak``), defined once.

Each of them, in this order:

1. :func:`service_workspace`: a temporary directory holding the state directory and a copy of
   conf/dev that this process and the services it starts use, an embedded broker on a free port,
   and the environment to start services with (``KAFKA_BOOTSTRAP_SERVERS`` pointing at that broker);
   all of it undone on the way out.
2. :func:`publish_history`: the topics created; a simulated portfolio of HISTORY_DAYS + 1 days
   (seed SIMULATION_SEED, MERCHANTS merchants, the bench's number of cards); the feature frame of
   every payment with its true label; the last day split off as the payments to send; the history
   before it and the labels reported before that day's first payment published to the transactions
   and labels topics. The result, :class:`PublishedHistory`, says what a ready service has consumed.
3. :func:`train_model` and :func:`register_model` once per version (the production architecture,
   :data:`pipeline.bench.train.BENCH_MODEL`, after a few optimiser steps: serving cost, not
   quality, is measured), and :func:`set_champion`.
4. ``fraudctl serve`` started and polled until :func:`ready_when` holds: the champion live and the
   whole history in its features.

What each bench measures, sends, and when, stays in its own module (``bench scoring`` times the
machine's jitter and the champion's single-row forward between steps 2 and 4, before any server).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow import MlflowClient

from models.fraud_mlp import FraudModel, FraudModelConfig, frame_to_tensors, save_model
from pipeline.bench.train import BENCH_MODEL
from pipeline.config import ENV_VAR_CONF_DIR, PROJECT_ROOT
from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.ingest.config import load_ingest_config
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from pipeline.paths import ENV_VAR_STATE_DIR
from pipeline.registry.config import RegistryConfig
from pipeline.registry.model_package import log_pyfunc_model, register_version
from pipeline.registry.store import CHAMPION, connect, ensure_experiment
from pipeline.serving.process import Ready
from pipeline.simulation import SimulationConfig, simulate
from pipeline.training.trainer import sequence_branch

HISTORY_DAYS = 7  # published before the day whose payments are sent
SIMULATION_SEED = 3
SIMULATION_START = "2026-03-01"
MERCHANTS = 400
TRAIN_ROWS = 5000  # sampled from the history for the few training steps
TRAIN_STEPS = 15
WARMUP_REQUESTS = 200  # the day's first payments, sent unmeasured before a measured run
CONCURRENCY = 8  # keep-alive connections of a closed-loop run
START_TIMEOUT_S = 180.0  # for a service to start and consume the history
REGISTRY_TAGS = {"source": "bench-scoring"}  # on every version a serving bench registers

_WORKSPACE_ENV = (ENV_VAR_STATE_DIR, ENV_VAR_CONF_DIR, "MLFLOW_TRACKING_URI", "KAFKA_BOOTSTRAP_SERVERS")


@dataclass(frozen=True, eq=False)  # eq=False: frames have no truth value to compare by
class PublishedHistory:
    """What :func:`publish_history` simulated and put on the topics."""

    history: pd.DataFrame  # payments before the last day, published
    today: pd.DataFrame  # the last day's payments, in event-time order, not published
    labels: pd.DataFrame  # labels reported before today's first payment, published
    features: pd.DataFrame  # every payment's feature row (history and today), with its true ``label``
    last_day: np.ndarray  # bool per payment (row of ``features``): on the last day
    consumed: int  # records a service has consumed once the whole history is in its features

    @property
    def history_features(self) -> pd.DataFrame:
        return self.features[~self.last_day]

    @property
    def today_features(self) -> pd.DataFrame:
        return self.features[self.last_day]


def conf_dir(workdir: Path, name: str = "conf", **model: float) -> Path:
    """A copy of conf/dev as ``workdir/name``, with the ``[model]`` values of serving.toml given."""
    conf = workdir / name
    shutil.copytree(PROJECT_ROOT / "conf" / "dev", conf)
    text = (conf / "serving.toml").read_text()
    for key, value in model.items():
        text, n = re.subn(rf"(?m)^{key} = [^ ]*", f"{key} = {value}", text)
        assert n == 1, f"conf/dev/serving.toml has no {key} line"
    (conf / "serving.toml").write_text(text)
    return conf


@contextmanager
def service_workspace(prefix: str) -> Iterator[tuple[Path, dict[str, str], EmbeddedBroker]]:
    """A temporary directory ``work`` whose state and conf directories (``work/state``,
    ``work/conf``) this process and the services it starts use, the environment to start them with,
    and an embedded broker on a free port that both point at. The broker is stopped and this
    process's environment restored on the way out."""
    saved = {k: os.environ.get(k) for k in _WORKSPACE_ENV}
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        os.environ.update({ENV_VAR_STATE_DIR: str(work / "state"), ENV_VAR_CONF_DIR: str(conf_dir(work))})
        broker = EmbeddedBroker("127.0.0.1", free_port(), work / "broker.log")
        broker.start()
        try:
            os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
            yield work, dict(os.environ), broker
        finally:
            broker.stop()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``frame`` as event records (missing optional fields left out, not null)."""
    return [{k: v for k, v in row.items() if v is not None} for row in frame.to_dict("records")]


def publish_history(broker: EmbeddedBroker, num_cards: int) -> PublishedHistory:
    """Create the topics on ``broker``, simulate HISTORY_DAYS + 1 days of ``num_cards`` cards, and
    publish every payment but the last day's, and the labels reported before it, to the
    transactions and labels topics (raises AssertionError if a record is not acknowledged)."""
    kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
    broker.create_topics(kafka.topics(), kafka.partitions)
    sim = simulate(SimulationConfig(seed=SIMULATION_SEED, start_date=SIMULATION_START, days=HISTORY_DAYS + 1,
                                    num_cards=num_cards, num_merchants=MERCHANTS))
    features = build_feature_frame(sim.transactions, sim.labels, load_ingest_config("dev").features)
    features["label"] = sim.truth["is_fraud"].astype(int).to_numpy()
    day = sim.transactions["event_time"].str[:10]
    last_day = (day == day.max()).to_numpy()
    history, today = sim.transactions[~last_day], sim.transactions[last_day]
    labels = sim.labels[sim.labels["reported_at"] < today["event_time"].min()]
    for kind, rows, topic in ((Kind.TRANSACTION, history, kafka.transactions_topic),
                              (Kind.LABEL, labels, kafka.labels_topic)):
        report = publish_records(kafka, topic, kind, records(rows))
        assert report.ok, report.errors
    return PublishedHistory(history=history, today=today, labels=labels, features=features, last_day=last_day,
                            consumed=len(history) + len(labels))


def train_model(features: pd.DataFrame, seed: int) -> FraudModel:
    """The production architecture after a few full-batch steps on a sample of ``features`` (with
    ``label``): realistic scores; the serving cost does not depend on how well it was trained."""
    torch.manual_seed(seed)
    features = features.sample(n=min(TRAIN_ROWS, len(features)), random_state=seed)
    # The sequence branch exactly as the trainer builds it for conf/prod's [model] (BENCH_MODEL).
    model = FraudModel(FraudModelConfig(fd.NUMERIC_FEATURES, dict(fd.CATEGORICAL_FEATURES),
                                        **{**BENCH_MODEL, **sequence_branch(fd.NUMERIC_FEATURES,
                                                                            BENCH_MODEL["sequence_hidden"])}))
    numeric, categorical = frame_to_tensors(features, model.config)
    squashed = torch.sign(numeric) * torch.log1p(numeric.abs())
    model.set_normalization(squashed.mean(0), squashed.std(0))
    labels = torch.tensor(features["label"].to_numpy(), dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(TRAIN_STEPS):
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model(numeric, categorical), labels).backward()
        optimizer.step()
    return model.eval()


def register_model(registry: RegistryConfig, model: FraudModel, workdir: Path) -> int:
    """Log ``model`` as a pyfunc (saved under ``workdir``) and register it; its new version."""
    client = connect(registry)
    saved = workdir / f"model-{id(model)}"
    save_model(model, saved)
    with mlflow.start_run(experiment_id=ensure_experiment(client, registry)):
        info = log_pyfunc_model(saved)
    return register_version(registry.model_name, info.model_uri, REGISTRY_TAGS)


def set_champion(registry: RegistryConfig, version: int, client: MlflowClient | None = None) -> None:
    """Point the champion alias at ``version``. ``client``: one already connected, for a move
    made mid-run (connecting checks the store with a round trip first)."""
    (client or connect(registry)).set_registered_model_alias(registry.model_name, CHAMPION, str(version))


def ready_when(version: int, consumed: int) -> Ready:
    """A /health predicate: ``version`` is live and ``consumed`` records (the whole published
    history, :attr:`PublishedHistory.consumed`) are in the features."""
    return lambda r: (r.status_code == 200 and r.json()["model"]["version"] == version
                      and sum(r.json()["stream"]["consumed"].values()) >= consumed)
