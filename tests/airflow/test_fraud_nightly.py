"""fraud_nightly end to end: the embedded broker, spark-submit on local Spark, torchrun with 2 gloo
processes, the SQLite MLflow store, all for real, on tiny data.

The runs are the story of tests/airflow/nights.py (the ``story`` fixture): under a real scheduler
(api-server, scheduler, dag-processor, LocalExecutor), the newest night that unpausing a fresh
deployment schedules, then night 1; under ``dag.test()``, night 2 with a worse model, night 2 again.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pipeline.datasets.manifest import load_manifest
from tests.airflow.nights import INGEST, NIGHT_1, SCORES_TOPIC, Story

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.spark]

DOWNSTREAM = ("train", "register", "gate", "monitor", "report")
TORCHRUN_AGENT = "pt_elastic"  # the process name of torchrun's elastic agent, which holds the c10d store


def _client(state: Path) -> MlflowClient:
    return MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")


def _aliases(state: Path) -> dict[str, int]:
    return {alias: int(v) for alias, v in _client(state).get_registered_model("fraud-detector").aliases.items()}


def test_unpausing_a_fresh_deployment_fails_its_newest_night_at_once_and_publishes_nothing(story):
    result, log = story.runs["unpaused"]
    assert (result["run_type"], result["state"]) == ("scheduled", "failed"), log[-5000:]
    run_date = date.fromisoformat(result["logical_date"][:10])
    assert run_date > story.newest_payment  # the newest night (catchup is off): Kafka has nothing of it
    # Failed, not up for retry, though the story's nightly.toml allows 2 (wait-run returns on either).
    assert (result["tasks"]["ingest"], result["tries"]["ingest"]) == ("failed", 1)
    assert {result["tasks"][t] for t in DOWNSTREAM} == {"upstream_failed"}
    assert "ingest failed: DatasetTooSmall: " in log  # jobs/ingest.py's own line, from spark-submit's output
    assert f"no payments of {run_date} on Kafka" in log and "NoDataForNight" in log
    # The two ways on that the message gives, as commands for this run and for the data there is.
    assert (f"airflow tasks clear fraud_nightly --start-date {result['logical_date']} "
            f"--end-date {result['logical_date']} --yes") in log
    assert f"airflow dags trigger fraud_nightly --logical-date {story.newest_payment}T02:00:00+00:00" in log
    assert not (story.state / "nightly" / run_date.isoformat() / "ingest.json").exists()
    assert story.manifests_after_failure == []  # no dataset version, no LATEST


def _listening(story: Story) -> dict[str, set[str]]:
    """Process name -> addresses, IPv4-mapped IPv6 (Java's ``::ffff:127.0.0.1``) as IPv4."""
    return {name: {ip.removeprefix("::ffff:") for ip in ips} for name, ips in story.listening.items()}


def test_the_deployment_listens_on_loopback_only(story):
    # Sampled through both nights: the API server, the scheduler (no log server), the tasks, and
    # spark-submit's driver JVM, seen listening. torchrun's agent: the next test.
    listening = {name: ips for name, ips in _listening(story).items() if name != TORCHRUN_AGENT}
    assert "java" in listening, listening
    assert set().union(*listening.values()) == {"127.0.0.1"}, listening


@pytest.mark.xfail(strict=True, reason="torchrun's c10d store (pipeline/training/launch.py) listens on '::', every "
                   "interface, even with nproc on one node: a defect of the training launch, reported in issue 35")
def test_the_training_rendezvous_listens_on_loopback_only(story):
    assert _listening(story).get(TORCHRUN_AGENT) == {"127.0.0.1"}


def test_a_triggered_night_under_the_scheduler_runs_every_task_and_leaves_their_outputs(story):
    result, log = story.runs["night-1"]
    assert (result["run_type"], result["state"]) == ("manual", "success"), log[-5000:]
    assert set(result["tasks"].values()) == {"success"} and set(result["tries"].values()) == {1}
    assert set(result["tasks"]) == {"ingest", *DOWNSTREAM}
    dataset, registered = result["xcoms"]["ingest"], result["xcoms"]["register"]
    # The tasks' effects, not only their states: the published dataset version, the registered model
    # version under the champion alias, the night's ledger records.
    manifest = load_manifest(Path(dataset["root"]), dataset["version"])
    assert (manifest.version, manifest.label_cutoff) == (dataset["version"], NIGHT_1.isoformat())
    client = _client(story.state)
    version = client.get_model_version(registered["model_name"], str(registered["version"]))
    assert client.get_run(version.run_id).info.status == "FINISHED"  # the MLflow run register logged
    assert client.get_model_version_by_alias(registered["model_name"], "champion").version == version.version
    for stage in ("ingest", "train", "register", "gate", "monitor", "report"):
        assert _ledger_record(story, NIGHT_1, stage) == result["xcoms"][stage]
    assert "decision: promoted: v1 is champion" in log  # the gate task's line, in the log the worker wrote


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
