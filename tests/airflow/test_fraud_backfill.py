"""fraud_backfill under ``dag.test()``: spark-submit of ``jobs/ingest.py --start/--end`` from the
run's params, on the raw store night 1 of the story (tests/airflow/nights.py) filled."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]


def test_backfilling_a_nights_range_republishes_its_dataset_version(story):
    result, log = story.runs["backfill"]
    assert result["state"] == "success", log[-5000:]
    rebuilt, night = result["xcoms"]["backfill"], story.runs["night-1"][0]["xcoms"]["ingest"]
    assert rebuilt["version"] == night["version"]  # the same rows and labels: the same content hash
    assert rebuilt["reused"] is True  # nothing rewritten
    assert rebuilt["landed"] == []  # from the raw store, not Kafka
