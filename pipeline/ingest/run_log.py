"""The run log: where an ingest run's library log lines go, so the terminal keeps the job's own.

One file per run, ``<state>/<logs.dir>/<run_id>.log``, receives

* Spark's log4j lines from the driver JVM (and the executors' in local mode), at
  ``[spark].log_level``: task failures come with long Java and Python stack traces;
* librdkafka's lines from every Kafka client of the run, on the driver and in the read tasks
  (:data:`pipeline.kafka.settings.LIBRDKAFKA_LOGGER`), and py4j's, at ``[logs].level``: a lost
  broker yields a "Connection refused" line per reconnect attempt and client.

What stays on the terminal: the ``[ingest]`` stage lines, the summary, and the one-line failure
message. Spark lines written before the JVM reads our log4j configuration (spark-submit's own
start-up) and lines of executors on other hosts stay where Spark puts them.

The Python side (:func:`routed_python_logs`) is process-wide while a run lasts and undone after;
the JVM side (:func:`log4j2_properties`, used by :mod:`pipeline.ingest.session`) is applied only
to sessions the run builds itself. Read tasks call :func:`route_task_logs` with the path the
driver gives them; an executor that cannot reach that path logs to its own stderr.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from pipeline.ingest.config import LogConfig
from pipeline.kafka.settings import LIBRDKAFKA_LOGGER

# Python loggers of the libraries whose lines belong in the run log.
PYTHON_LOGGERS = (LIBRDKAFKA_LOGGER, "py4j")
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RUN_LOG_NOTE = "details in the run log"  # start of the note an exception leaving a run carries


@dataclass(frozen=True)
class RunLog:
    path: Path
    level: str  # Python logging level name for librdkafka and py4j lines


# The run log of the run in progress in this process (set by routed_python_logs), so the Kafka
# source can hand its path to the read tasks.
ACTIVE_RUN_LOG: ContextVar[RunLog | None] = ContextVar("ACTIVE_RUN_LOG", default=None)


def run_log_for(config: LogConfig, run_id: str) -> RunLog:
    return RunLog(config.directory() / f"{run_id}.log", config.level)


@contextmanager
def routed_python_logs(log: RunLog) -> Iterator[RunLog]:
    """While the block runs, librdkafka and py4j lines go to ``log.path`` only (not to handlers
    the application may have on the root logger); afterwards the loggers are as they were.
    An exception leaving the block gets a note (``RUN_LOG_NOTE <path>``) when the log has lines."""
    log.path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log.path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(LINE_FORMAT))
    loggers = [logging.getLogger(name) for name in PYTHON_LOGGERS]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(log.level)
        lg.propagate = False
    token = ACTIVE_RUN_LOG.set(log)
    try:
        yield log
    except Exception as exc:
        handler.flush()
        if log.path.stat().st_size:
            exc.add_note(f"{RUN_LOG_NOTE} {log.path}")
        raise
    finally:
        ACTIVE_RUN_LOG.reset(token)
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.setLevel(level)
            lg.propagate = propagate
        handler.close()


_task_handler: logging.Handler | None = None  # the handler a (reused) Python worker installed last


def route_task_logs(path: str, level: str) -> None:
    """In a Spark read task: send librdkafka's lines to the run log at ``path`` (appending, as
    the driver and the other tasks do), or to this worker's stderr where the path's directory does
    not exist on this host. Idempotent per path (Python workers are reused across tasks)."""
    global _task_handler
    if _task_handler is not None and getattr(_task_handler, "baseFilename", None) == str(Path(path).absolute()):
        return
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    if _task_handler is not None:
        logger.removeHandler(_task_handler)
        _task_handler.close()
    target = Path(path)
    handler = logging.FileHandler(target, encoding="utf-8") if target.parent.is_dir() \
        else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LINE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    _task_handler = handler


def log4j2_properties(log_file: Path, level: str) -> str:
    """A log4j2 configuration sending every Spark logger to ``log_file`` (appended) at ``level``
    and nothing to the console."""
    return "\n".join([
        "status = error",  # log4j's own status messages: only its errors
        f"rootLogger.level = {level.lower()}",
        "rootLogger.appenderRef.run.ref = run",
        "appender.run.type = File",
        "appender.run.name = run",
        f"appender.run.fileName = {log_file}",
        "appender.run.append = true",
        "appender.run.layout.type = PatternLayout",
        "appender.run.layout.pattern = %d{yyyy-MM-dd HH:mm:ss.SSS} %p %c{1}: %m%n%ex",
        # Spark's defaults quieten these below the root level; keep that.
        "logger.jetty.name = org.sparkproject.jetty",
        "logger.jetty.level = warn",
        "logger.parquet.name = org.apache.parquet.CorruptStatistics",
        "logger.parquet.level = error",
        "",
    ])
