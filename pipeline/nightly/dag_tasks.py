"""What the tasks of ``airflow_dags/`` run: the DAG files only declare tasks and their order.

Needs the ``airflow`` extra (and apache-airflow-providers-apache-spark, installed by ``make setup``).
Tasks hand each other only dates and the stages' records (XCom); every task calls the stage of
:mod:`pipeline.nightly.stages` that ``fraudctl nightly --stage ...`` calls, and the ingest tasks
spark-submit ``jobs/ingest.py`` exactly as a person would. Heavy imports (Spark, torch, MLflow)
happen inside the tasks, never while the scheduler parses the DAG files.

A stage's expected failure fails its task with the job's own message in the log. Training that
cannot start (a config or dataset no attempt can fix) fails at once, without retries, and so does
a monitor whose day has no matured labels in the raw store, and a night whose ingest landed all
Kafka held and still has no payments of its run date (:class:`NoDataForNight`: on a fresh
deployment, the newest night that unpausing schedules). A gate that rejects the challenger is
a successful task whose record says ``rejected``; a monitor that finds a degraded model is a
successful task whose record and log say ``degraded``.
"""

from __future__ import annotations

import json
import sys
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import get_current_context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from pipeline.config import PROJECT_ROOT
from pipeline.nightly import stages, text
from pipeline.nightly.config import NightlyConfig, ScheduleConfig, SparkSubmitConfig, load_nightly_config
from pipeline.nightly.records import (
    GateOutcome,
    MonitorOutcome,
    NightLedger,
    PublishedDataset,
    RegisteredModel,
    TrainedRun,
)
from pipeline.paths import state_dir

INGEST_JOB = PROJECT_ROOT / "jobs" / "ingest.py"
BACKFILL_REPORTS = "backfills"  # <state>/nightly/backfills/<start>_<end>.json


def default_args(schedule: ScheduleConfig) -> dict[str, Any]:
    """Retries with exponential backoff for every task (each stage is idempotent, so a retry is safe)."""
    return {
        "owner": "fraud-ml",
        "retries": schedule.retries,
        "retry_delay": timedelta(seconds=schedule.retry_delay_s),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(seconds=schedule.max_retry_delay_s),
    }


def start_date(schedule: ScheduleConfig) -> pendulum.DateTime:
    return pendulum.parse(schedule.start_date, tz=schedule.timezone)


def run_date_of(context: dict[str, Any], timezone: str) -> date:
    """The night's run date: the logical date (start of the day the run covers) in the schedule's zone."""
    logical = context.get("logical_date")
    if logical is None:
        raise AirflowFailException("this DAG run has no logical date: trigger it with one (the run date, "
                                   "`airflow dags trigger fraud_nightly --logical-date 2026-02-04T02:00:00+00:00`)")
    return pendulum.instance(logical).in_timezone(timezone).date()


def _ledger(config: NightlyConfig) -> tuple[date, NightLedger]:
    run_date = run_date_of(get_current_context(), config.schedule.timezone)
    return run_date, NightLedger.for_date(run_date)


def _echo(lines: list[str]) -> None:
    for line in lines:
        print(line, flush=True)  # the task log


# ---- ingest: spark-submit ---------------------------------------------------------------------------


class IngestJobOperator(SparkSubmitOperator):
    """spark-submit ``jobs/ingest.py`` (master, deploy mode: the Airflow connection; ``--conf``: the
    config) and return the dataset it published, read from the job's ``--report-json``.

    Subclasses give the job's arguments and where its report goes. A report left by an earlier
    attempt is removed first, so the record returned is always this attempt's.
    """

    def __init__(self, *, spark: SparkSubmitConfig, **kwargs: Any) -> None:
        super().__init__(application=str(INGEST_JOB), conn_id=spark.conn_id, conf=dict(spark.conf), name=spark.name,
                         **kwargs)

    def job_arguments(self, context: dict[str, Any]) -> tuple[list[str], Path]:
        raise NotImplementedError

    def execute(self, context: dict[str, Any]) -> dict[str, Any]:
        arguments, report = self.job_arguments(context)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.unlink(missing_ok=True)
        self.application_args = [*arguments, "--report-json", str(report)]
        # The driver and its Python workers run this interpreter (the one with the project installed)
        # unless the deployment says otherwise.
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                         **(self.env_vars or {})}
        super().execute(context)
        dataset = self.record(PublishedDataset.from_ingest_report(json.loads(report.read_text())), context)
        _echo(text.describe_dataset(dataset))
        return dataset.to_dict()

    def record(self, dataset: PublishedDataset, context: dict[str, Any]) -> PublishedDataset:
        return dataset


class NoDataForNight(AirflowFailException):
    """The night's ingest read everything Kafka held, and no payment of its run date was among it.

    Not retried: an attempt minutes later reads the same Kafka. The run fails at once instead of
    holding the DAG's only ``max_active_runs`` slot through its retries. On a first deployment this
    is the run that unpausing schedules (the newest night, catchup is off), a day nothing was
    published for yet.
    """


class NightlyIngestOperator(IngestJobOperator):
    """``jobs/ingest.py --run-date D``: new Kafka records, then the night's dataset (ledger record ``ingest``).

    A failed job whose run landed Kafka (a new commit in the raw store) while the raw store still
    has no payment dated D or later raises :class:`NoDataForNight` (no retries); any other failure
    is the job's own, retried as configured.
    """

    def __init__(self, *, timezone: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.timezone = timezone

    def execute(self, context: dict[str, Any]) -> dict[str, Any]:
        from pipeline.contract import Kind
        from pipeline.ingest.config import load_ingest_config
        from pipeline.ingest.raw_layout import RawStore

        run_date = run_date_of(context, self.timezone)
        store = RawStore(load_ingest_config().raw.root())
        runs_before = set(store.committed().runs)
        try:
            return super().execute(context)
        except AirflowException as failed:  # spark-submit exited non-zero
            landed = set(store.committed().runs) - runs_before  # the job read Kafka to its end
            newest = store.latest_date(Kind.TRANSACTION)
            if landed and (newest is None or newest < run_date):
                raise NoDataForNight(no_data_message(run_date, newest, context["logical_date"], self.timezone)) from failed
            raise

    def job_arguments(self, context: dict[str, Any]) -> tuple[list[str], Path]:
        run_date = run_date_of(context, self.timezone)
        return ["--run-date", run_date.isoformat()], NightLedger.for_date(run_date).ingest_report

    def record(self, dataset: PublishedDataset, context: dict[str, Any]) -> PublishedDataset:
        NightLedger.for_date(run_date_of(context, self.timezone)).write(dataset)
        return dataset


def no_data_message(run_date: date, newest: date | None, logical_date: datetime, timezone: str) -> str:
    """What an operator reads when a night has no payments: why nothing is retried, and the two ways on."""
    logical = pendulum.instance(logical_date).in_timezone(timezone)
    if newest is None:
        held, trigger = "the raw store is empty", ""
    else:
        night = logical.replace(year=newest.year, month=newest.month, day=newest.day).isoformat()
        held = f"the raw store's payments end on {newest}"
        trigger = f"; or run the newest night they hold: airflow dags trigger fraud_nightly --logical-date {night}"
    return (f"no payments of {run_date} on Kafka: ingest landed everything Kafka held, and {held}. Not retried: another attempt would read the same Kafka. On a first deployment this "
            f"is the night unpausing scheduled; later, the payments feed has stopped. Once {run_date}'s payments are "
            f"on Kafka, clear this run: airflow tasks clear fraud_nightly --start-date {logical.isoformat()} "
            f"--end-date {logical.isoformat()} --yes{trigger}")


class BackfillIngestOperator(IngestJobOperator):
    """``jobs/ingest.py --start S --end E [--from-kafka]`` from the run's params."""

    def job_arguments(self, context: dict[str, Any]) -> tuple[list[str], Path]:
        params = context["params"]
        try:
            start, end = date.fromisoformat(params["start"]), date.fromisoformat(params["end"])
        except (TypeError, ValueError) as exc:
            raise AirflowFailException(f"params start and end must be dates (YYYY-MM-DD), got "
                                       f"{params.get('start')!r} and {params.get('end')!r}") from exc
        arguments = ["--start", start.isoformat(), "--end", end.isoformat()]
        if params.get("from_kafka"):
            arguments.append("--from-kafka")
        return arguments, state_dir() / "nightly" / BACKFILL_REPORTS / f"{start}_{end}.json"


# ---- train, register, gate, monitor, report: in the task's process ---------------------------------


def train_task(dataset: dict[str, Any]) -> dict[str, Any]:
    from pipeline.training.launch import TrainingCannotStart

    config = load_nightly_config()
    _, ledger = _ledger(config)
    try:
        trained = stages.train(None, config.train, PublishedDataset.from_dict(dataset), ledger)
    except stages.StageFailed as exc:
        if isinstance(exc.__cause__, TrainingCannotStart):
            raise AirflowFailException(f"{exc} (not retried: no attempt can change this)") from exc
        raise
    _echo(text.describe_run(trained))
    return trained.to_dict()


def register_task(trained: dict[str, Any]) -> dict[str, Any]:
    from pipeline.registry.config import load_registry_config

    _, ledger = _ledger(load_nightly_config())
    registered = stages.register(load_registry_config(), TrainedRun.from_dict(trained), ledger)
    _echo(text.describe_model(registered))
    return registered.to_dict()


def gate_task(registered: dict[str, Any], dataset: dict[str, Any]) -> dict[str, Any]:
    from pipeline.registry.config import load_registry_config

    _, ledger = _ledger(load_nightly_config())
    outcome = stages.gate(load_registry_config(), RegisteredModel.from_dict(registered),
                          PublishedDataset.from_dict(dataset), ledger)
    _echo([*text.describe_gate(outcome), text.decision_line(outcome)])
    return outcome.to_dict()


def monitor_task() -> dict[str, Any]:
    """The live versions on ``run date - label_maturity_days`` (runs after the gate: both may move champion)."""
    from pipeline.monitoring.config import load_monitoring_config
    from pipeline.monitoring.monitor import LabelsNotMature, MonitorSources

    run_date, ledger = _ledger(load_nightly_config())
    try:
        monitored = stages.monitor(load_monitoring_config(), MonitorSources.load(None), run_date, ledger)
    except stages.StageFailed as exc:
        if isinstance(exc.__cause__, LabelsNotMature):
            raise AirflowFailException(f"{exc} (not retried: the raw store must be ingested further first)") from exc
        raise
    _echo([*text.describe_monitor(monitored), text.monitor_line(monitored)])
    return monitored.to_dict()


def report_task(dataset: dict[str, Any], trained: dict[str, Any], registered: dict[str, Any],
                outcome: dict[str, Any], monitored: dict[str, Any]) -> dict[str, Any]:
    run_date, ledger = _ledger(load_nightly_config())
    night = stages.report(run_date, PublishedDataset.from_dict(dataset), TrainedRun.from_dict(trained),
                          RegisteredModel.from_dict(registered), GateOutcome.from_dict(outcome),
                          MonitorOutcome.from_dict(monitored), ledger)
    _echo(text.describe_night(night))
    return night.to_dict()
