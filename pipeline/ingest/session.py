"""The one place a SparkSession for ingest is built.

Master precedence: explicit ``master`` argument (``--master``) > the master ``spark-submit``
already set > ``$SPARK_MASTER`` > ``[spark].master`` in ingest.toml (the last two are resolved by
the config loader). Workers run this interpreter (``spark.pyspark.python``), so executors import
the same ``pipeline`` package and pyarrow/confluent-kafka as the driver.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipeline.ingest.config import SparkConfig


def launched_by_spark_submit() -> bool:
    """True when spark-submit started this interpreter (its JVM is already up and configured)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def resolve_master(config: SparkConfig, master: str | None = None) -> str | None:
    """The master to set, or None to keep the one spark-submit was given (it always has one)."""
    if master:
        return master
    if launched_by_spark_submit():
        return None
    return config.master


def session_settings(config: SparkConfig, master: str | None = None) -> dict[str, str]:
    """All ``spark.*`` settings the session gets (pure; logged in the run summary)."""
    settings = {
        "spark.app.name": config.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.driver.memory": config.driver_memory,
        "spark.ui.enabled": str(config.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "true",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
    }
    resolved = resolve_master(config, master)
    if resolved:
        settings["spark.master"] = resolved
    if config.loopback_only:
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(config.conf)
    return settings


def build_spark_session(config: SparkConfig, master: str | None = None) -> SparkSession:
    """Build (or join) the session; the caller stops it when the job ends."""
    # Python workers inherit the environment: make sure they resolve the same interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    for key, value in session_settings(config, master).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(config.log_level)
    return spark
