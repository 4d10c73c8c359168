"""The DAG files as the scheduler sees them: they import without errors, and each DAG has the
tasks, order, schedule and retry policy the nightly config asks for."""

from __future__ import annotations

import pytest

from pipeline.nightly.config import load_nightly_config


@pytest.fixture(scope="module")
def dagbag(run_airflow):
    result, _ = run_airflow("structure", env={"FRAUD_ENV": "dev"})
    return result


def test_the_dags_folder_imports_without_errors(dagbag):
    assert dagbag["import_errors"] == {}
    assert set(dagbag["dags"]) == {"fraud_nightly", "fraud_backfill"}


def test_nightly_runs_the_stages_in_order_and_passes_each_stage_its_inputs(dagbag):
    tasks = dagbag["dags"]["fraud_nightly"]["tasks"]
    assert {name: task["upstream"] for name, task in tasks.items()} == {
        "ingest": [],
        "train": ["ingest"],  # the dataset version
        "register": ["train"],  # the run directory
        "gate": ["ingest", "register"],  # the model version, gated on the night's dataset
        "monitor": ["gate"],  # after the gate: both may move champion
        "report": ["gate", "ingest", "monitor", "register", "train"],
    }
    assert tasks["ingest"]["operator"] == "NightlyIngestOperator"  # a SparkSubmitOperator


def test_nightly_schedule_and_retries_come_from_the_config(dagbag):
    schedule = load_nightly_config("dev").schedule
    nightly = dagbag["dags"]["fraud_nightly"]
    assert nightly["timetable"] == f"CronDataIntervalTimetable(expression='{schedule.cron}', timezone='{schedule.timezone}')"
    assert (nightly["max_active_runs"], nightly["catchup"]) == (1, False)
    for task in nightly["tasks"].values():
        assert (task["retries"], task["retry_delay_s"], task["max_retry_delay_s"]) == (
            schedule.retries, schedule.retry_delay_s, schedule.max_retry_delay_s)
        assert task["retry_exponential_backoff"] > 1


def test_backfill_is_one_spark_submit_driven_by_params(dagbag):
    backfill = dagbag["dags"]["fraud_backfill"]
    assert backfill["params"] == ["end", "from_kafka", "start"]
    assert {name: task["operator"] for name, task in backfill["tasks"].items()} == {"backfill": "BackfillIngestOperator"}
    assert backfill["max_active_runs"] == 1
