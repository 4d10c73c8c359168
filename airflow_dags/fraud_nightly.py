"""fraud_nightly: one production night, ingest -> train -> register -> gate -> monitor -> report.

Runs at ``[schedule].cron`` of conf/<env>/nightly.toml (02:00 UTC) for the day that just ended: the
run's logical date is the night's run date (the start of the interval it covers). One run at a
time, no catchup, retries with exponential backoff. Each task calls one stage of
:mod:`pipeline.nightly.stages` (``fraudctl nightly --run-date D --stage X`` by hand):

* ``ingest``: spark-submit ``jobs/ingest.py --run-date D`` -> the dataset version (XCom);
* ``train``: torchrun ``jobs/train.py`` on that version ([train] of nightly.toml) -> the run directory;
* ``register``: MLflow run + model version, alias ``challenger`` -> the version;
* ``gate``: challenger vs champion on the night's holdout -> promoted or rejected (both succeed);
* ``monitor``: the live versions on ``D - label_maturity_days`` (the day whose fraud reports have
  just matured) -> ok, degraded, insufficient evidence or nothing to monitor (all succeed; with
  ``auto_rollback`` a degraded champion is rolled back); after the gate, as both may move champion;
* ``report``: the night's summary, ``<state>/nightly/D/report.json``.

Re-running a night (clear the run) redoes only what is missing: every stage is idempotent.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, task

from pipeline.nightly import dag_tasks
from pipeline.nightly.config import load_nightly_config

config = load_nightly_config()
schedule = config.schedule

with DAG(
    dag_id="fraud_nightly",
    description="Kafka -> Spark dataset -> DDP training -> MLflow registry -> gated promotion -> live monitoring",
    schedule=CronDataIntervalTimetable(schedule.cron, timezone=schedule.timezone),
    start_date=dag_tasks.start_date(schedule),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(seconds=schedule.dagrun_timeout_s),
    default_args=dag_tasks.default_args(schedule),
    doc_md=__doc__,
    tags=["fraud", "nightly"],
):
    ingest = dag_tasks.NightlyIngestOperator(task_id="ingest", spark=config.spark_submit,
                                             timezone=schedule.timezone)
    train = task(task_id="train")(dag_tasks.train_task)(ingest.output)
    register = task(task_id="register")(dag_tasks.register_task)(train)
    gate = task(task_id="gate")(dag_tasks.gate_task)(register, ingest.output)
    monitor = task(task_id="monitor")(dag_tasks.monitor_task)()
    gate >> monitor
    task(task_id="report")(dag_tasks.report_task)(ingest.output, train, register, gate, monitor)
