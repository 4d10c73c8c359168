"""The one place a SparkSession for ingest is built.

Master precedence: explicit ``master`` argument (``--master``) > the master ``spark-submit``
already set > ``$SPARK_MASTER`` > ``[spark].master`` in ingest.toml (the last two are resolved by
the config loader). Workers run this interpreter (``spark.pyspark.python``), so executors import
the same ``pipeline`` package and pyarrow/confluent-kafka as the driver.

Given a log file, Spark's log4j output goes there instead of the console (see
:mod:`pipeline.ingest.run_log`): through ``-Dlog4j2.configurationFile`` when this process starts
the JVM (start-up lines included), and by reconfiguring log4j once the session exists (a JVM that
spark-submit or an earlier session started). A JVM this process starts also gets the log file as
its stderr, for the lines it writes there itself, outside log4j (the JDK's "Using incubator
modules" warning, a thread's uncaught-exception trace). No console progress bars either way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipeline.ingest.config import SparkConfig
from pipeline.ingest.run_log import log4j2_properties

JAVA_OPTIONS = "spark.driver.extraJavaOptions"


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


def session_settings(config: SparkConfig, master: str | None = None,
                     log4j_file: Path | None = None) -> dict[str, str]:
    """All ``spark.*`` settings the session gets (pure). ``log4j_file``: a log4j2 configuration
    the driver JVM starts with (appended to any ``spark.driver.extraJavaOptions`` of the config)."""
    settings = {
        "spark.app.name": config.app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.driver.memory": config.driver_memory,
        "spark.ui.enabled": str(config.ui_enabled).lower(),
        "spark.ui.showConsoleProgress": "false",  # bars would interleave with the [ingest] lines
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
    if log4j_file is not None:
        option = f"-Dlog4j2.configurationFile={log4j_file.absolute().as_uri()}"
        settings[JAVA_OPTIONS] = f"{settings[JAVA_OPTIONS]} {option}" if JAVA_OPTIONS in settings else option
    return settings


@contextmanager
def _jvm_stderr_to(log_file: Path | None) -> Iterator[None]:
    """While a JVM may be started: this process's stderr (fd 2, which the JVM inherits) is
    ``log_file``. Nothing changes when there is no log file or the JVM is already up."""
    if log_file is None or launched_by_spark_submit() or SparkContext._gateway is not None:
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    with open(log_file, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        os.close(terminal)


def build_spark_session(config: SparkConfig, master: str | None = None, log_file: Path | None = None) -> SparkSession:
    """Build (or join) the session; the caller stops it when the job ends.

    With ``log_file``, Spark's log lines are appended there from now on, process-wide (log4j is
    one per JVM), at ``config.log_level``.
    """
    # Python workers inherit the environment: make sure they resolve the same interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    log4j_file = None
    if log_file is not None:
        log4j_file = log_file.with_name(f".{log_file.stem}.log4j2.properties")
        log4j_file.parent.mkdir(parents=True, exist_ok=True)
        log4j_file.write_text(log4j2_properties(log_file, config.log_level))
    try:
        builder = SparkSession.builder
        for key, value in session_settings(config, master, log4j_file).items():
            builder = builder.config(key, value)
        with _jvm_stderr_to(log_file):
            spark = builder.getOrCreate()
        if log4j_file is not None:  # the JVM may predate this session: point log4j at the file now
            jvm = spark.sparkContext._jvm
            jvm.org.apache.logging.log4j.core.config.Configurator.reconfigure(
                jvm.java.net.URI.create(log4j_file.absolute().as_uri()))
    finally:
        if log4j_file is not None:
            log4j_file.unlink(missing_ok=True)  # log4j has read it (at start-up or just now)
    spark.sparkContext.setLogLevel(config.log_level)
    return spark
