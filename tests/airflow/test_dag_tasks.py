"""The DAG tasks' no-retry path, called as plain functions (no DAG run): a stage that no attempt can
fix fails its task with AirflowFailException, which Airflow does not retry, carrying the stage's message.
The ingest operator's rule is driven with spark-submit replaced by what a failed job leaves in the
raw store (tests/airflow/test_fraud_nightly.py runs the real job under a scheduler)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from pipeline.contract import Kind
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.raw_layout import DATE_COLUMN_BY_KIND, RUN_ID, RawStore
from pipeline.monitoring.monitor import LabelsNotMature
from pipeline.nightly import dag_tasks, stages
from pipeline.nightly.config import SparkSubmitConfig
from pipeline.nightly.records import PublishedDataset
from pipeline.training.launch import TrainingCannotStart
from pipeline.training.run_dir import runs_root

RUN_DATE = datetime.fromisoformat("2026-02-04T02:00:00+00:00")  # the night's logical date


@pytest.fixture(autouse=True)
def task_context(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What Airflow gives a running task, here only its logical date; a fresh, empty state directory."""
    monkeypatch.setattr(dag_tasks, "get_current_context", lambda: {"logical_date": RUN_DATE})


def test_training_that_cannot_start_fails_the_task_without_retries(tmp_path):
    missing = tmp_path / "no-dataset"  # the version ingest reported is not published there
    dataset = PublishedDataset(name="fraud-dev", root=str(missing), version="v-gone", label_cutoff="2026-02-01",
                               rows=1000, frauds=20, reused=False)
    with pytest.raises(dag_tasks.AirflowFailException) as failed:
        dag_tasks.train_task(dataset.to_dict())
    message = str(failed.value)
    assert message.startswith("train failed: training not started: ManifestError: dataset version 'v-gone' is "
                              f"not published under {missing}")
    assert message.endswith("(not retried: no attempt can change this)")
    stage_failed = failed.value.__cause__
    assert isinstance(stage_failed, stages.StageFailed) and isinstance(stage_failed.__cause__, TrainingCannotStart)
    assert not runs_root().exists()  # refused before any run directory or torchrun


def test_a_monitor_whose_labels_have_not_matured_fails_the_task_without_retries():
    with pytest.raises(dag_tasks.AirflowFailException) as failed:
        dag_tasks.monitor_task()  # the fresh state directory's raw store is empty
    message = str(failed.value)
    assert message.startswith("monitor failed: LabelsNotMature: the fraud reports of ")
    assert "the raw store is empty" in message
    assert message.endswith("(not retried: the raw store must be ingested further first)")
    assert isinstance(failed.value.__cause__.__cause__, LabelsNotMature)


SPARK_SUBMIT_FAILED = dag_tasks.AirflowException("Cannot execute: spark-submit ... Error code is: 1.")


def _failed_job(monkeypatch: pytest.MonkeyPatch, *, lands: bool, payment_days: tuple[str, ...] = ()) -> None:
    """spark-submit replaced by a job that exits 1, after committing a Kafka landing (``lands``) whose
    payments fall on ``payment_days``, or before reading Kafka (a broker it could not reach)."""
    def execute(self, context):
        if lands:
            store = RawStore(load_ingest_config().raw.root())
            for day in payment_days:
                (store.table_path(Kind.TRANSACTION) / f"{DATE_COLUMN_BY_KIND[Kind.TRANSACTION]}={day}"
                 / f"{RUN_ID}=run-1").mkdir(parents=True)
            store.offsets.commit("run-1", [])
        raise SPARK_SUBMIT_FAILED

    monkeypatch.setattr(dag_tasks.IngestJobOperator, "execute", execute)


def _ingest(context=None):
    operator = dag_tasks.NightlyIngestOperator(task_id="ingest", spark=SparkSubmitConfig(), timezone="UTC")
    return operator.execute(context or {"logical_date": RUN_DATE})


def test_a_night_kafka_has_no_payments_of_fails_without_retries_and_says_how_to_go_on(monkeypatch):
    _failed_job(monkeypatch, lands=True, payment_days=("2026-01-31", "2026-02-01"))
    with pytest.raises(dag_tasks.NoDataForNight) as failed:
        _ingest()
    assert isinstance(failed.value, dag_tasks.AirflowFailException)  # Airflow does not retry it
    assert failed.value.__cause__ is SPARK_SUBMIT_FAILED  # the job's failure stays in the log
    assert str(failed.value) == (
        "no payments of 2026-02-04 on Kafka: ingest landed everything Kafka held, and the raw store's payments "
        "end on 2026-02-01. Not retried: another attempt would read the same Kafka. On a first deployment this is "
        "the night unpausing scheduled; later, the payments feed has stopped. Once 2026-02-04's payments are on "
        "Kafka, clear this run: airflow tasks clear fraud_nightly --start-date 2026-02-04T02:00:00+00:00 "
        "--end-date 2026-02-04T02:00:00+00:00 --yes; or run the newest night they hold: "
        "airflow dags trigger fraud_nightly --logical-date 2026-02-01T02:00:00+00:00")


def test_a_night_on_an_empty_kafka_fails_without_retries(monkeypatch):
    _failed_job(monkeypatch, lands=True)
    with pytest.raises(dag_tasks.NoDataForNight, match=r"and the raw store is empty\. Not retried") as failed:
        _ingest()
    assert "dags trigger" not in str(failed.value)  # no night to suggest


@pytest.mark.parametrize(("lands", "payment_days"), [
    (False, ()),  # failed before it read Kafka (unreachable, the store's lock held): a retry may succeed
    (True, ("2026-02-04",)),  # the night's payments are there: the job's own failure, retried as configured
])
def test_other_ingest_failures_stay_the_jobs_own_and_are_retried(monkeypatch, lands, payment_days):
    _failed_job(monkeypatch, lands=lands, payment_days=payment_days)
    with pytest.raises(dag_tasks.AirflowException) as failed:
        _ingest()
    assert failed.value is SPARK_SUBMIT_FAILED
