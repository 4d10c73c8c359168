"""One local Spark session shared by every Spark test in this process (start-up costs seconds).

Imported by tests/ingest/conftest.py and tests/features/conftest.py. The session lives until the
interpreter exits; tests must not stop it. Multi-JVM runs (local-cluster) happen in subprocesses.
"""

from __future__ import annotations

import atexit

import pytest
from pyspark.sql import SparkSession

from pipeline.ingest.config import SparkConfig
from pipeline.ingest.session import build_spark_session

TEST_SPARK = SparkConfig(master="local[2]", app_name="fraud-tests", shuffle_partitions=2, log_level="ERROR")
_session: SparkSession | None = None


def shared_session() -> SparkSession:
    global _session
    if _session is None:
        _session = build_spark_session(TEST_SPARK)
        atexit.register(_session.stop)
    return _session


@pytest.fixture(scope="session")
def spark() -> SparkSession:
    """A local[2] SparkSession (UTC, 2 shuffle partitions)."""
    return shared_session()
