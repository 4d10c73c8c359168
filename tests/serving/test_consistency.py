"""Online features (what the service scored with) equal the offline rebuild from the raw store.

The end-to-end test is the production path: Spark ingests history into the raw store, the
service seeds from it and consumes the topics from its committed offsets, scores a day over HTTP
and publishes each decision; the raw store then ingests that day, and the consistency check
rebuilds its features offline and compares them with the published ones.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import replace
from datetime import date

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.params import FeatureParams
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.progress import quiet
from pipeline.kafka.producer import publish_records
from pipeline.serving.config import ScoresConfig, StreamConfig
from pipeline.serving.consistency import check_consistency, compare
from tests.serving import factory
from tests.serving.conftest import app_of, event
from tests.spark_fixtures import spark  # noqa: F401  (shared session fixture)

DAY = date(2026, 3, 1)


def test_compare_counts_matches_mismatches_and_missing_rows():
    row = {name: float(i) for i, name in enumerate(fd.FEATURE_COLUMNS)}
    online = {"a": dict(row), "b": {**row, "amount": row["amount"] + 1e-6}, "c": dict(row),
              "d": {**row, "hour": row["hour"] * (1 + 1e-12)}}
    offline = {"a": row, "b": row, "d": row}  # "c" never reached the raw store
    report = compare(online, offline, DAY)
    assert (report.scored, report.compared, report.matched, report.missing_offline) == (4, 3, 2, 1)
    assert report.share == 0.5 and report.mismatched_features == {"amount": 1}
    assert report.examples == [{"transaction_id": "b", "feature": "amount", "online": row["amount"] + 1e-6,
                                "offline": row["amount"]}]


def wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert condition(), "timed out"


def records(frame: pd.DataFrame) -> list[dict]:
    return [event(r) for r in frame.to_dict("records")]


@pytest.mark.spark
@pytest.mark.broker
@pytest.mark.slow
def test_served_features_equal_the_offline_rebuild(spark, kafka_config, serving_config,  # noqa: F811
                                                  make_service, window, champion):
    tx, labels = window.transactions, window.labels
    served_day = "2026-03-07"
    history, today = tx[tx["event_time"] < served_day], tx[tx["event_time"].str[:10] == served_day]
    old_reports = labels["reported_at"] < served_day
    ingest = load_ingest_config("dev")
    ingest = dataclasses.replace(ingest, spark=dataclasses.replace(ingest.spark, shuffle_partitions=2),
                                 features=factory.PARAMS)
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, records(history)).ok
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, records(labels[old_reports])).ok
    run_raw_ingest(ingest, kafka_config, spark=spark, progress=quiet())
    # Reports made since the last ingest exist only in Kafka: the service must take them from there.
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, records(labels[~old_reports])).ok

    topic = f"scores-{kafka_config.transactions_topic}"
    serving = replace(serving_config, stream=StreamConfig(seed_from_raw_store=True, consume=True),
                      scores=ScoresConfig(topic=topic, create_topic=True))
    service = make_service(serving, kafka=kafka_config, raw_root=ingest.raw.root())
    with TestClient(app_of(service)) as http:
        wait_for(lambda: http.get("/ready").status_code == 200)
        stream = http.get("/health").json()["stream"]
        assert stream["seed"]["payments"] == len(history) and stream["seed"]["labels"] == old_reports.sum()
        wait_for(lambda: http.get("/health").json()["stream"]["consumed"].get(kafka_config.labels_topic)
                 == (~old_reports).sum())
        for row in records(today):
            assert http.post("/score", json=row).status_code == 200
        wait_for(lambda: http.get("/health").json()["scores"]["published"] == len(today))

    # The day's payments reach the raw store the usual way; then the check rebuilds them.
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, records(today)).ok
    run_raw_ingest(ingest, kafka_config, spark=spark, progress=quiet())
    report = check_consistency(date.fromisoformat(served_day), kafka_config, topic, ingest.raw.root(), factory.PARAMS)
    assert (report.scored, report.compared, report.matched) == (len(today), len(today), len(today)), report.examples
    assert report.share == 1.0

    # The check is not blind: rebuilt with another label delay, the merchant fraud rates disagree.
    skewed = check_consistency(date.fromisoformat(served_day), kafka_config, topic, ingest.raw.root(),
                               FeatureParams(label_delay_hours=0.0, label_match_days=90))
    assert skewed.share < 1.0 and any(name.startswith("merchant_fraud_rate") for name in skewed.mismatched_features)
