"""Monitoring fixtures: the registry tests' MLflow store and trained models, a config directory
pointing the monitor at this test's broker topics and raw store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from tests.registry.conftest import client, config, trained, world  # noqa: F401  (shared registry fixtures)

MATURITY_DAYS = 7


@dataclass(frozen=True)
class Deployment:
    """The test's conf directory ($FRAUD_CONF_DIR), raw store and scores topic."""

    conf: Path
    raw: Path
    kafka: KafkaConfig
    scores_topic: str

    def write_monitoring(self, **settings) -> None:
        lines = [f"{k} = {str(v).lower() if isinstance(v, bool) else v}" for k, v in settings.items()]
        (self.conf / "monitoring.toml").write_text("\n".join(lines) + "\n")


@pytest.fixture
def deployment(tmp_path: Path, kafka_config: KafkaConfig, config: RegistryConfig) -> Deployment:  # noqa: F811
    conf, raw = tmp_path / "conf", tmp_path / "raw"
    conf.mkdir()
    topic = f"scores-{kafka_config.transactions_topic}"
    (conf / "kafka.toml").write_text(
        f'bootstrap_servers = "{kafka_config.bootstrap_servers}"\ntransactions_topic = "{kafka_config.transactions_topic}"\n'
        f'labels_topic = "{kafka_config.labels_topic}"\npartitions = {kafka_config.partitions}\n')
    (conf / "serving.toml").write_text(f'[scores]\ntopic = "{topic}"\n')
    (conf / "ingest.toml").write_text(f'[raw]\npath = "{raw}"\n\n[dataset]\nlabel_maturity_days = {MATURITY_DAYS}\n')
    (conf / "registry.toml").write_text(f'model_name = "{config.model_name}"\nlock_timeout_s = 60.0\n')
    deployment = Deployment(conf, raw, kafka_config, topic)
    deployment.write_monitoring(recall_margin=0.1, degraded_after_days=2, min_frauds=20, feature_sample_rows=1000)
    return deployment
