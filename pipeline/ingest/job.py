"""The ingest job as a Python API: what ``jobs/ingest.py``, ``fraudctl ingest``, the demo and the
benchmark call.

* :func:`run_nightly` — read new Kafka records into the raw store, then build and publish the
  dataset whose label cutoff is the run date;
* :func:`run_backfill` — rebuild the dataset for ``[start, end]`` from the raw store (after
  catching up from Kafka when ``from_kafka``);
* :func:`run_raw_ingest` — only the Kafka -> raw store part.

All hold the raw store's lock for the whole run and are idempotent: rerunning with unchanged
Kafka data commits an empty run and republishes the same dataset version (same content hash).
A dataset with a split below the configured minimums is not published (``DatasetTooSmall``);
Kafka records the run landed stay committed. Library log lines (Spark, py4j, librdkafka) go to
the run log, ``<state>/logs/ingest/<run_id>.log`` by default (:mod:`pipeline.ingest.run_log`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime

from pyspark.sql import SparkSession

from pipeline.config import ConfigError
from pipeline.datasets.manifest import ManifestError
from pipeline.ingest.accounting import AccountingError, TopicAccounting
from pipeline.ingest.config import IngestConfig, load_ingest_config
from pipeline.ingest.dataset_builder import DatasetSummary, build_dataset, data_until
from pipeline.ingest.dataset_plan import DatasetPlan, DatasetTooSmall, PlanError, plan_backfill, plan_nightly
from pipeline.ingest.kafka_source import KafkaReadError
from pipeline.ingest.offsets import OffsetGapError
from pipeline.ingest.progress import Progress, StageRecord
from pipeline.ingest.raw_ingest import IngestRun, land_and_commit, prepare_run
from pipeline.ingest.raw_layout import IngestLocked, RawStore
from pipeline.ingest.run_log import RUN_LOG_NOTE, RunLog, routed_python_logs, run_log_for
from pipeline.ingest.session import build_spark_session
from pipeline.kafka.admin import KafkaUnavailable
from pipeline.kafka.settings import KafkaConfig, load_kafka_config

# Failures whose message tells the operator what to do (exit 1, no trace).
OPERATOR_ERRORS = (KafkaUnavailable, KafkaReadError, OffsetGapError, PlanError, DatasetTooSmall, IngestLocked,
                   AccountingError, ConfigError, ManifestError)


@dataclass(frozen=True)
class IngestReport:
    """Outcome of one run: accounting per topic (when Kafka was read) and the published dataset."""

    run_id: str
    mode: str  # "nightly" | "backfill" | "raw"
    accounting: tuple[TopicAccounting, ...]
    dataset: DatasetSummary | None
    run_manifest: str | None
    stages: tuple[StageRecord, ...]
    log_file: str | None = None  # the run log (Spark, py4j and librdkafka lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accounting"] = [a.to_dict() for a in self.accounting]
        return d


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def load_job_configs(env: str | None, bootstrap_servers: str | None = None) -> tuple[IngestConfig, KafkaConfig]:
    """conf/<env>/ingest.toml and kafka.toml; ``bootstrap_servers`` (the CLI option) wins."""
    kafka = load_kafka_config(env)
    if bootstrap_servers:
        kafka = dataclasses.replace(kafka, bootstrap_servers=bootstrap_servers)
    return load_ingest_config(env), kafka


@contextmanager
def _session(config: IngestConfig, spark: SparkSession | None, master: str | None,
             run_log: RunLog) -> Iterator[SparkSession]:
    """The caller's session, the process's active one, or one built for this run and stopped after it
    (only that one logs to the run log: another session's logging is its owner's business)."""
    spark = spark or SparkSession.getActiveSession()
    if spark is not None:
        yield spark
        return
    own = build_spark_session(config.spark, master, run_log.path)
    try:
        yield own
    finally:
        own.stop()


@dataclass(frozen=True)
class JobOptions:
    """How a job runs, the same for every mode: the entry points' keyword options."""

    allow_data_loss: bool = False  # plan past offsets Kafka no longer holds (counted as lost)
    master: str | None = None  # Spark master for a session built here
    spark: SparkSession | None = None  # the caller's session (else the active one, else built)
    progress: Progress | None = None


def _run(config: IngestConfig, kafka: KafkaConfig | None, mode: str, plan_for, options: JobOptions) -> IngestReport:
    """Lock, optionally land Kafka records, optionally build ``plan_for(store)``'s dataset."""
    progress, allow_data_loss = options.progress or Progress(), options.allow_data_loss
    run_id = new_run_id()
    store = RawStore(config.raw.root())
    run_log = run_log_for(config.logs, run_id)
    progress.emit(f"{progress.prefix} run {run_id}: Spark and Kafka client logs go to {run_log.path}")
    with routed_python_logs(run_log), store.locked():
        plans = prepare_run(store, kafka, allow_data_loss, progress) if kafka is not None else None
        # Plan the dataset before Spark starts when the raw store will not change (fail fast).
        plan: DatasetPlan | None = plan_for(store) if plan_for is not None and plans is None else None
        with _session(config, options.spark, options.master, run_log) as session:
            landed = (land_and_commit(IngestRun.begin(session, store, config, kafka, run_id, allow_data_loss, progress),
                                      plans) if plans is not None else None)
            dataset = None
            if plan_for is not None:
                plan = plan or plan_for(store)
                with progress.stage("features + shards + manifest") as counts:
                    dataset = build_dataset(session, store, plan, config.dataset, config.features, run_id)
                    counts.update(dataset_stage_counts(dataset))
    return IngestReport(run_id, mode, landed.accounting if landed else (), dataset,
                        landed.run_manifest if landed else None, tuple(progress.stages), str(run_log.path))


def dataset_stage_counts(dataset: DatasetSummary) -> dict:
    """The dataset stage line's counts. ``rows``/``frauds`` are the whole published dataset; with a
    gap they exceed the splits table's sum by the gap days' rows, which the line says (and why)."""
    in_splits = sum(split["rows"] for split in dataset.splits.values())
    counts: dict = {"version": dataset.version, "rows": dataset.rows, "frauds": dataset.frauds}
    if dataset.splits and dataset.rows > in_splits:
        gap_frauds = dataset.frauds - sum(split["frauds"] for split in dataset.splits.values())
        counts["gap"] = (f"{dataset.rows - in_splits} rows, {gap_frauds} frauds (in rows, in no split: "
                         "the evaluator reads the cards they report)")
    return {**counts, "reused": dataset.reused}


def run_nightly(config: IngestConfig, kafka: KafkaConfig, run_date: date, *, allow_data_loss: bool = False,
                master: str | None = None, spark: SparkSession | None = None,
                progress: Progress | None = None) -> IngestReport:
    """Kafka -> raw store, then the dataset with label cutoff ``run_date`` (see dataset_plan)."""
    plan = plan_nightly(run_date, config.dataset)  # pure: a bad window fails before anything starts
    return _run(config, kafka, "nightly", lambda store: plan, JobOptions(allow_data_loss, master, spark, progress))


def run_backfill(config: IngestConfig, kafka: KafkaConfig | None, start: date, end: date, *,
                 from_kafka: bool = False, allow_data_loss: bool = False, master: str | None = None,
                 spark: SparkSession | None = None, progress: Progress | None = None) -> IngestReport:
    """Rebuild the dataset for ``[start, end]`` from the raw store (first from Kafka if ``from_kafka``)."""
    return _run(config, kafka if from_kafka else None, "backfill",
                lambda store: plan_backfill(start, end, config.dataset, data_until(store)),
                JobOptions(allow_data_loss, master, spark, progress))


def run_raw_ingest(config: IngestConfig, kafka: KafkaConfig, *, allow_data_loss: bool = False,
                   master: str | None = None, spark: SparkSession | None = None,
                   progress: Progress | None = None) -> IngestReport:
    """Only Kafka -> raw store (used by the benchmark)."""
    return _run(config, kafka, "raw", None, JobOptions(allow_data_loss, master, spark, progress))


def failure_message(exc: BaseException) -> str | None:
    """An operator-facing one-liner for an expected failure, or None for a bug (show the trace).

    Errors raised inside executor tasks (a Kafka read that failed) reach the driver wrapped in
    Spark's exceptions; their own message is dug out. The run log's path (an exception note added
    by the run) is appended: the stack traces and client lines are there, not on the terminal.
    """
    if isinstance(exc, OPERATOR_ERRORS):
        message = f"{type(exc).__name__}: {exc}"
    else:
        text = str(exc)
        marker = f"{KafkaReadError.__name__}: "
        if marker not in text:
            return None
        message = marker + text.split(marker, 1)[1].splitlines()[0]
    notes = [n for n in getattr(exc, "__notes__", ()) if n.startswith(RUN_LOG_NOTE)]
    return f"{message} ({notes[-1]})" if notes else message
