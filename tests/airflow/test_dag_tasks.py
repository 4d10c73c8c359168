"""The DAG tasks' no-retry path, called as plain functions (no DAG run): a stage that no attempt can
fix fails its task with AirflowFailException, which Airflow does not retry, carrying the stage's message."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from pipeline.monitoring.monitor import LabelsNotMature
from pipeline.nightly import dag_tasks, stages
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
