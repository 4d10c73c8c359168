"""Config directories and environments for running the ingest job as its own process."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from pipeline.config import PROJECT_ROOT
from pipeline.kafka.settings import KafkaConfig


def write_conf_dir(directory: Path, kafka: KafkaConfig, ingest_settings: dict[str, str] | None = None,
                   request_timeout_s: float = 15.0) -> Path:
    """conf/dev copied to ``directory`` with this test's broker and topics; ``ingest_settings``
    replaces the values of existing ingest.toml keys (``{"max_records_per_split": "2000"}``)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("simulation.toml", "demo.toml"):
        source = PROJECT_ROOT / "conf" / "dev" / name
        if source.is_file():
            (directory / name).write_text(source.read_text())
    (directory / "kafka.toml").write_text(
        f'bootstrap_servers = "{kafka.bootstrap_servers}"\ntransactions_topic = "{kafka.transactions_topic}"\n'
        f'labels_topic = "{kafka.labels_topic}"\npartitions = {kafka.partitions}\n'
        f"request_timeout_s = {request_timeout_s}\n")
    ingest = (PROJECT_ROOT / "conf" / "dev" / "ingest.toml").read_text()
    # These tests exercise ingest mechanics on a month of data: no protocol gap unless asked for.
    for key, value in ({"gap_days": "0"} | (ingest_settings or {})).items():
        ingest, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", ingest, flags=re.M)
        assert n == 1, key
    (directory / "ingest.toml").write_text(ingest)
    return directory


def job_env(state: Path, conf: Path) -> dict[str, str]:
    """Environment of a job process: isolated state and config, workers on this interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "SPARK_MASTER"))}
    env.update(FRAUD_STATE_DIR=str(state), FRAUD_CONF_DIR=str(conf), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    return env


@contextmanager
def local_cluster_logs() -> Iterator[dict[str, str]]:
    """Executor stderr logs of the local-cluster apps started inside the block, keyed by executor id.

    Spark's local-cluster workers always log under ``$SPARK_HOME/work`` (the venv's pyspark here);
    the apps this block created are read, then removed.
    """
    work = Path(pyspark.__file__).parent / "work"
    before = set(work.glob("app-*")) if work.is_dir() else set()
    logs: dict[str, str] = {}
    try:
        yield logs
    finally:
        for app in sorted(set(work.glob("app-*")) - before):
            logs.update({p.parent.name: p.read_text(errors="replace") for p in app.glob("*/stderr")})
            shutil.rmtree(app, ignore_errors=True)
