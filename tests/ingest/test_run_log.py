"""The run log: library lines go to one file per run, the terminal and the caller's logging are left alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.ingest import run_log
from pipeline.ingest.config import LogConfig, SparkConfig
from pipeline.ingest.run_log import (
    ACTIVE_RUN_LOG,
    RUN_LOG_NOTE,
    RunLog,
    log4j2_properties,
    route_task_logs,
    routed_python_logs,
    run_log_for,
)
from pipeline.ingest.session import session_settings
from pipeline.kafka.settings import LIBRDKAFKA_LOGGER

librdkafka = logging.getLogger(LIBRDKAFKA_LOGGER)


@pytest.fixture
def restored_librdkafka_logger() -> Iterator[None]:
    """route_task_logs configures the worker process it runs in; here that is the test process."""
    saved = (list(librdkafka.handlers), librdkafka.level, librdkafka.propagate)
    yield
    for handler in set(librdkafka.handlers) - set(saved[0]):
        librdkafka.removeHandler(handler)
        handler.close()
    librdkafka.setLevel(saved[1])
    librdkafka.propagate = saved[2]
    run_log._task_handler = None


def test_the_run_log_lives_under_the_state_directory(state_dir):
    assert run_log_for(LogConfig(), "r1") == RunLog(state_dir / "logs" / "ingest" / "r1.log", "INFO")


def test_library_lines_go_to_the_file_only_while_the_run_lasts(tmp_path, caplog):
    log = RunLog(tmp_path / "logs" / "r1.log", "INFO")
    with caplog.at_level(logging.DEBUG), routed_python_logs(log):
        assert ACTIVE_RUN_LOG.get() == log
        librdkafka.error("FAIL Connect to ipv4#127.0.0.1:1 failed: Connection refused")
        logging.getLogger("py4j.clientserver").info("Closing down clientserver connection")
        librdkafka.debug("below the configured level")
    text = log.path.read_text()
    assert "ERROR pipeline.kafka.librdkafka: FAIL Connect" in text and "py4j.clientserver" in text
    assert "below the configured level" not in text
    assert "Connection refused" not in caplog.text  # not echoed by the caller's handlers
    assert ACTIVE_RUN_LOG.get() is None
    librdkafka.error("after the run")
    assert "after the run" in caplog.text and "after the run" not in log.path.read_text()


def test_an_error_leaving_the_run_names_the_log_when_it_has_lines(tmp_path):
    log = RunLog(tmp_path / "r1.log", "INFO")
    with pytest.raises(RuntimeError) as raised, routed_python_logs(log):
        librdkafka.error("Connection refused")
        raise RuntimeError("broker lost")
    assert raised.value.__notes__ == [f"{RUN_LOG_NOTE} {log.path}"]
    with pytest.raises(RuntimeError) as quiet_run, routed_python_logs(RunLog(tmp_path / "r2.log", "INFO")):
        raise RuntimeError("nothing logged")
    assert not getattr(quiet_run.value, "__notes__", [])


def test_read_tasks_append_to_the_drivers_file_or_fall_back_to_their_stderr(tmp_path, restored_librdkafka_logger, capsys):
    path = tmp_path / "r1.log"
    route_task_logs(str(path), "WARNING")
    route_task_logs(str(path), "WARNING")  # a reused worker: still one handler
    librdkafka.error("from a task")
    librdkafka.info("too detailed")
    assert path.read_text().count("from a task") == 1 and "too detailed" not in path.read_text()
    route_task_logs(str(tmp_path / "elsewhere" / "r1.log"), "WARNING")  # another host's path
    librdkafka.error("on the executor")
    assert "on the executor" in capsys.readouterr().err and "on the executor" not in path.read_text()


def test_spark_logs_to_the_file_without_console_progress(tmp_path):
    props = log4j2_properties(tmp_path / "r1.log", "WARN")
    assert f"appender.run.fileName = {tmp_path / 'r1.log'}" in props and "rootLogger.level = warn" in props
    assert "Console" not in props
    spark = SparkConfig(conf={"spark.driver.extraJavaOptions": "-Xss4m"})
    settings = session_settings(spark, log4j_file=Path("/logs/.r1.log4j2.properties"))
    assert settings["spark.driver.extraJavaOptions"] == "-Xss4m -Dlog4j2.configurationFile=file:///logs/.r1.log4j2.properties"
    assert settings["spark.ui.showConsoleProgress"] == "false"
    assert "spark.driver.extraJavaOptions" not in session_settings(SparkConfig())
