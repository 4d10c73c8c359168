"""Shared fixtures: an isolated state directory and a real embedded Kafka broker on a free port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.settings import KafkaConfig


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $FRAUD_STATE_DIR at a fresh temp dir so nothing touches the project's .state/."""
    path = tmp_path / "state"
    path.mkdir()
    monkeypatch.setenv("FRAUD_STATE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """One real Tansu broker for the session, on a free loopback port; stopped at the end."""
    log = tmp_path_factory.mktemp("broker") / "broker.log"
    broker = EmbeddedBroker("127.0.0.1", free_port(), log)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def kafka_config(kafka_broker: EmbeddedBroker, request: pytest.FixtureRequest) -> KafkaConfig:
    """Settings for the session broker with topic names unique to this test (no cross-test bleed)."""
    suffix = request.node.name.replace("[", "-").replace("]", "").replace("/", "-")[:80]
    config = KafkaConfig(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        transactions_topic=f"transactions-{suffix}",
        labels_topic=f"fraud-labels-{suffix}",
        partitions=4,
    )
    kafka_broker.create_topics(config.topics(), config.partitions)
    return config


@pytest.fixture(autouse=True)
def _isolate_mlflow_uri() -> Iterator[None]:
    """``mlflow.set_tracking_uri`` exports $MLFLOW_TRACKING_URI; without this, a test's store would leak
    into the subprocesses (fraudctl, torchrun) of every later test."""
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if saved is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = saved


AIRFLOW_TESTS = "tests/airflow"  # as node ids spell it (relative to the rootdir)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called when `make test` runs workers
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` with tests/airflow as one unit: a test file runs whole on one worker (its
    module fixtures are built once), and the DAG tests share one migrated Airflow DB and the story of
    tests/airflow/nights.py, which is played once per session, as without workers."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesWithAirflowAsOne(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return AIRFLOW_TESTS if path.startswith(f"{AIRFLOW_TESTS}/") else path

    return FilesWithAirflowAsOne(config, log)
