"""fraud_nightly end to end under ``dag.test()``: the embedded broker, spark-submit on local Spark,
torchrun with 2 gloo processes, the SQLite MLflow store, all for real, on tiny data.

The runs are the story of tests/airflow/nights.py (the ``story`` fixture): a night before there is
enough data, night 1, night 2 with a worse model, night 2 again.
"""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.airflow.nights import INGEST, NIGHT_1, SCORES_TOPIC, TOO_EARLY, Story

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]


def _aliases(state: Path) -> dict[str, int]:
    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")
    return {alias: int(v) for alias, v in client.get_registered_model("fraud-detector").aliases.items()}


def test_a_failed_stage_fails_the_run_with_the_jobs_message_and_publishes_nothing(story):
    result, log = story.runs["too-early"]
    assert result["state"] == "failed"
    assert result["tasks"]["ingest"] == "failed"
    assert {result["tasks"][t] for t in ("train", "register", "gate", "monitor", "report")} == {"upstream_failed"}
    assert re.search(r"ingest failed: DatasetTooSmall: .*train", log)  # jobs/ingest.py's own line
    ledger = story.state / "nightly" / TOO_EARLY.isoformat()
    assert not (ledger / "ingest.json").exists()
    assert story.manifests_after_failure == []  # no dataset version, no LATEST


def test_first_night_promotes_its_model_through_every_stage(story):
    result, log = story.runs["night-1"]
    assert result["state"] == "success", log[-5000:]
    dataset, trained = result["xcoms"]["ingest"], result["xcoms"]["train"]
    registered, gate = result["xcoms"]["register"], result["xcoms"]["gate"]
    assert dataset["label_cutoff"] == NIGHT_1.isoformat() and dataset["version"].startswith(NIGHT_1.isoformat())
    assert trained["dataset_version"] == dataset["version"]  # the version ingest published, not LATEST
    assert Path(trained["run_dir"]).name == f"nightly-{dataset['version']}"
    assert (Path(trained["run_dir"]) / "summary.json").is_file()
    assert registered["version"] == 1 and registered["run_dir"] == trained["run_dir"]
    assert (gate["outcome"], gate["promoted"], gate["champion_version"]) == ("promoted", True, 1)
    assert result["xcoms"]["report"]["gate"] == gate
    assert _ledger_record(story, NIGHT_1, "report") == result["xcoms"]["report"]


def test_the_monitor_task_with_no_scores_topic_reports_nothing_to_monitor_and_succeeds(story):
    result, log = story.runs["night-1"]
    assert result["tasks"]["monitor"] == "success", log[-5000:]
    monitored = result["xcoms"]["monitor"]
    monitored_date = (NIGHT_1 - timedelta(days=int(INGEST["label_maturity_days"]))).isoformat()
    assert (monitored["monitored_date"], monitored["state"], monitored["versions"]) == (
        monitored_date, "nothing_to_monitor", [])
    assert result["xcoms"]["report"]["monitor"] == monitored == _ledger_record(story, NIGHT_1, "monitor")
    assert f"monitor {monitored_date}: nothing_to_monitor" in log  # the task log's line
    report = json.loads((story.state / "monitoring" / monitored_date / "report.json").read_text())
    assert report["scores_topic"] == {"name": SCORES_TOPIC, "found": False}


def test_a_worse_model_is_rejected_the_run_succeeds_and_the_champion_stays(story):
    result, log = story.runs["night-2"]
    assert result["state"] == "success", log[-5000:]
    assert set(result["tasks"].values()) == {"success"}
    gate = result["xcoms"]["gate"]
    assert (gate["outcome"], gate["promoted"]) == ("rejected", False)
    assert (gate["challenger_version"], gate["compared_with"], gate["champion_version"]) == (2, 1, 1)
    assert any(reason.startswith("AUC-ROC") for reason in gate["reasons"]), gate["reasons"]  # worse, not noise
    assert "rejected v2 (a normal outcome; champion stays v1)" in log
    assert _aliases(story.state) == {"champion": 1, "challenger": 2}


def test_a_night_with_resent_payments_completes_and_reports_them_as_duplicates(story):
    result, log = story.runs["night-2"]
    assert result["state"] == "success", log[-5000:]
    transactions = next(a for a in result["xcoms"]["ingest"]["landed"] if a["kind"] == "transaction")
    assert transactions["duplicates"] == story.resent
    assert transactions["read"] == transactions["valid"] + transactions["quarantined"] + story.resent
    assert f"{story.resent} duplicates" in log  # the task log's Kafka line


def test_rerunning_a_night_redoes_nothing(story):
    first, _ = story.runs["night-2"]
    again, log = story.runs["night-2-again"]
    assert again["state"] == "success", log[-5000:]
    assert again["xcoms"]["ingest"]["version"] == first["xcoms"]["ingest"]["version"]
    assert again["xcoms"]["ingest"]["reused"] is True  # same bytes republished
    assert again["xcoms"]["train"]["reused"] is True  # nothing launched
    assert again["xcoms"]["register"]["version"] == 2  # no new version
    assert again["xcoms"]["gate"]["replayed"] is True and again["xcoms"]["gate"]["outcome"] == "rejected"
    assert _aliases(story.state) == {"champion": 1, "challenger": 2}


def _ledger_record(story: Story, night: date, stage: str) -> dict:
    return json.loads((story.state / "nightly" / night.isoformat() / f"{stage}.json").read_text())
