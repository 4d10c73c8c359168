"""The story the DAG tests share: tiny simulated traffic on the embedded broker, a config
directory written for the test, and the DAG runs of three nights (played once per session).

Under a real scheduler (tests/airflow/deployment.py), a first deployment as the README has it:

1. ``airflow dags unpause fraud_nightly``: the scheduler runs the newest night (catchup is off), a
   date Kafka holds no payments of; its ingest fails at once, without retries, and publishes nothing;
2. ``airflow dags trigger fraud_nightly --logical-date <night 1>``: the first model is promoted.

Then under ``dag.test()``, on the same metadata DB and state:

3. fraud_backfill rebuilds night 1's date range;
4. night 2, trained with a config that makes a worse model, and with night 1's oldest and newest
   payments resent on Kafka (at-least-once delivery): the resends are duplicates, the gate
   rejects the model;
5. night 2 again: every stage finds its output and redoes nothing.

No scoring service runs in the story: each night's monitor finds no scores topic and reports
"nothing to monitor" (tests/monitoring drives the monitor on real score events).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

import pandas as pd

from pipeline.config import PROJECT_ROOT
from pipeline.contract import Kind
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import Simulation, load_simulation_config, simulate
from pipeline.training.config import derive_train_config, write_train_toml
from tests.airflow.conftest import SPARK_CONN_ID
from tests.airflow.deployment import Deployment
from tests.ingest.process_helpers import write_conf_dir

START = date(2026, 1, 1)
NIGHT_1 = date(2026, 1, 14)  # 7 train + 2 validation + 2 test days, labels mature after 3 more
NIGHT_2 = NIGHT_1 + timedelta(days=1)
# Night 1's dataset spans these days (its label cutoff is NIGHT_1): what a backfill of it rebuilds.
NIGHT_1_FIRST_DAY, NIGHT_1_LAST_DAY = date(2026, 1, 1), date(2026, 1, 11)
# Small windows and a high fraud rate: every split holds frauds, and the gate sees enough of them.
INGEST = {"train_days": "7", "validation_days": "2", "test_days": "2", "label_maturity_days": "3",
          "min_rows": "{ train = 1000, validation = 200, test = 200 }", "shuffle_partitions": "2"}
TRAIN = {"data": {"global_batch_size": 512}, "loop": {"epochs": 3, "log_every": 20},
         "checkpoint": {"every_steps": 40}}
# What makes night 2's model worse: a learning rate that leaves the network at its initialisation, and
# no LightGBM blend (a booster would rescue the untrained network and the blend would be promoted).
WORSE = {"optim": {"lr": 1e-9}, "schedule": {"warmup_steps": 1}, "loop": {"epochs": 1, "max_steps": 4},
         "blend": {"gbm": False}}
REGISTRY = """\
experiment_name = "fraud-training"
model_name = "fraud-detector"
holdout_split = "test"
lock_timeout_s = 120.0

[gate]
auc_margin = 0.002
first_model_auc_floor = 0.7
ap_tolerance = { value = 0.02, mode = "block" }
ece_limit = { value = 0.05, mode = "warn" }      # tiny models are poorly calibrated; not what this tests
psi_limit = { value = 0.25, mode = "warn" }
min_holdout_frauds = { value = 10, mode = "block" }
max_nan_share = { value = 0.0, mode = "block" }
"""
# Under the scheduler, dev's retry policy: a task that should fail without retries and did not
# would wait 5 minutes for its retry (dag_runner wait-run returns as soon as one does).
SCHEDULER_RETRIES, DAG_TEST_RETRIES = "retries = 2\nretry_delay_s = 300.0", "retries = 0"
NIGHTLY = f"""\
[schedule]
cron = "0 2 * * *"
timezone = "UTC"
start_date = "2026-01-01"
{{retries}}

[spark_submit]
conn_id = "{SPARK_CONN_ID}"

[train]
nproc_per_node = 2
max_restarts = 0
"""


@dataclass
class Story:
    state: Path
    conf: Path
    kafka: KafkaConfig
    runs: dict[str, tuple[dict[str, Any], str]]  # name -> (dag_runner result, task logs)
    manifests_after_failure: list[Path]
    resent: int  # night 1's payments published again before night 2
    newest_payment: date  # of what night 1 found on Kafka
    listening: dict[str, set[str]]  # process name -> the addresses it listened on, through both nights


def _logical(run_date: date) -> str:
    return datetime.combine(run_date, time(2), tzinfo=UTC).isoformat()


def _publish(kafka: KafkaConfig, sim: Simulation, until: datetime, since: datetime | None) -> None:
    """Payments and fraud reports made in [since, until): what Kafka holds by a night's cut-off."""
    def window(frame: pd.DataFrame, column: str) -> pd.DataFrame:
        at = pd.to_datetime(frame[column], utc=True, format="ISO8601")
        return frame[(at < until) & ((at >= since) if since else True)]

    tx = window(sim.transactions, "event_time")
    labels = window(sim.labels, "reported_at")
    for topic, kind, frame in ((kafka.transactions_topic, Kind.TRANSACTION, tx), (kafka.labels_topic, Kind.LABEL, labels)):
        records = [{k: v for k, v in r.items() if not pd.isna(v)} for r in frame.to_dict("records")]
        assert publish_records(kafka, topic, kind, records).ok


RESENT_OLDEST, RESENT_NEWEST = 100, 300  # the oldest are weeks behind: a copy of them used to be late


def _resend(kafka: KafkaConfig, sim: Simulation, until: datetime) -> int:
    """Publish again, byte for byte, the oldest and the newest payments made before ``until``."""
    at = pd.to_datetime(sim.transactions["event_time"], utc=True, format="ISO8601")
    sent = sim.transactions[at < until].sort_values("event_time")
    again = pd.concat([sent.head(RESENT_OLDEST), sent.tail(RESENT_NEWEST)])
    records = [{k: v for k, v in r.items() if not pd.isna(v)} for r in again.to_dict("records")]
    assert publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, records).ok
    return len(records)


SCORES_TOPIC = "dag-scores"  # never created: no service scored in this story, so nothing to monitor


def _write_conf(conf: Path, kafka: KafkaConfig, train_overrides: dict, retries: str) -> None:
    write_conf_dir(conf, kafka, INGEST)
    (conf / "registry.toml").write_text(REGISTRY)
    (conf / "nightly.toml").write_text(NIGHTLY.format(retries=retries))
    (conf / "serving.toml").write_text(f'[scores]\ntopic = "{SCORES_TOPIC}"\n')
    (conf / "monitoring.toml").write_text((PROJECT_ROOT / "conf" / "dev" / "monitoring.toml").read_text())
    table = derive_train_config("dev", {**TRAIN, **{k: {**TRAIN.get(k, {}), **v} for k, v in train_overrides.items()}})
    write_train_toml(table, conf / "train.toml")


def play_story(run_airflow, airflow_home: Path, kafka_broker, tmp: Path) -> Story:
    """The DAG runs of the story, in order, against a fresh state and config directory under ``tmp``."""
    state, conf = tmp / "state", tmp / "conf"
    kafka = KafkaConfig(bootstrap_servers=kafka_broker.bootstrap_servers, transactions_topic="dag-transactions",
                        labels_topic="dag-fraud-labels", partitions=2)
    kafka_broker.create_topics(kafka.topics(), kafka.partitions)
    base = load_simulation_config("dev")
    # Fraud reported within days: the 3-day label maturity then sees most of it.
    sim = simulate(dataclasses.replace(base, start_date=START.isoformat(), days=15, num_cards=1000, num_merchants=100,
                                       fraud_rate=0.02, seed=5,
                                       label_delay=dataclasses.replace(base.label_delay, fraud_median_days=1.0)))
    env = {"FRAUD_STATE_DIR": str(state), "FRAUD_CONF_DIR": str(conf)}
    _write_conf(conf, kafka, {}, SCHEDULER_RETRIES)
    cutoff_1 = datetime.combine(NIGHT_1 + timedelta(days=1), time(0), tzinfo=UTC)
    _publish(kafka, sim, until=cutoff_1, since=None)
    deployment = Deployment(airflow_home, env, run_airflow)
    runs, manifests = _first_deployment(deployment, state)
    runs["backfill"] = run_airflow("test", "fraud_backfill", _logical(NIGHT_1), "--conf",
                                   json.dumps({"start": NIGHT_1_FIRST_DAY.isoformat(), "end": NIGHT_1_LAST_DAY.isoformat()}),
                                   env=env)
    resent = _resend(kafka, sim, until=cutoff_1)
    _publish(kafka, sim, until=cutoff_1 + timedelta(days=1), since=cutoff_1)
    _write_conf(conf, kafka, WORSE, DAG_TEST_RETRIES)
    runs["night-2"] = run_airflow("test", "fraud_nightly", _logical(NIGHT_2), env=env)
    runs["night-2-again"] = run_airflow("test", "fraud_nightly", _logical(NIGHT_2), env=env)
    newest = pd.to_datetime(sim.transactions["event_time"], utc=True, format="ISO8601")
    return Story(state, conf, kafka, runs, manifests, resent, newest[newest < cutoff_1].max().date(),
                 deployment.listening)


def _first_deployment(deployment: Deployment, state: Path) -> tuple[dict[str, tuple[dict[str, Any], str]], list[Path]]:
    """The README's Airflow steps on the session's AIRFLOW_HOME: its one-host block (the connection,
    the three components), unpause (the newest night runs and fails), trigger night 1. Everything
    started is stopped on the way out. Returns the runs and the dataset files after the failed night."""
    deployment.setup()
    try:
        deployment.start()
        deployment.wait_parsed("fraud_nightly")
        deployment.cli("dags", "unpause", "fraud_nightly")
        runs = {"unpaused": deployment.wait_run("fraud_nightly", run_type="scheduled")}
        manifests = sorted(state.glob("datasets/*/manifests/*.json")) + sorted(state.glob("datasets/*/LATEST"))
        deployment.cli("dags", "trigger", "fraud_nightly", "--logical-date", _logical(NIGHT_1))
        runs["night-1"] = deployment.wait_run("fraud_nightly", logical_date=_logical(NIGHT_1))
    finally:
        deployment.stop()
    return runs, manifests
