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
from pipeline.serving.consistency import check_consistency, compare, compare_scores
from pipeline.serving.score_event import ScoreEvent
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


def _decision(tid: str, version: int, score: float, decision: str, decided_by: str = "score") -> ScoreEvent:
    return ScoreEvent(transaction_id=tid, card_id="card", event_time="2026-03-01T10:00:00Z", model_version=version,
                      score=score, decision=decision, decided_by=decided_by, rules=(), thresholds=(), features={},
                      scored_at="2026-03-01T10:00:01Z", review_threshold=0.3, block_threshold=0.8)


def test_compare_scores_rescored_per_version_and_decided_at_the_recorded_thresholds():
    row = {name: 0.0 for name in fd.FEATURE_COLUMNS}
    offline = {tid: {**row, "amount": amount} for tid, amount in
               (("a", 0.1), ("b", 0.5), ("c", 0.85), ("d", 0.2), ("e", 0.9))}
    decisions = {"a": _decision("a", 1, 0.1, "allow"), "b": _decision("b", 1, 0.5, "review"),
                 "c": _decision("c", 2, 0.85 + 1e-4, "block"),  # served off by 1e-4: a skewed score
                 "d": _decision("d", 2, 0.2, "review"),  # decided review at a score that allows: a skewed decision
                 "e": _decision("e", 2, 0.9, "allow", decided_by="allowlist"),  # a rule decided: not compared
                 "f": _decision("f", 1, 0.4, "review")}  # not in the raw store
    asked = []

    def score(version, frame):  # each version's offline model: here the rebuilt amount is the score
        asked.append((version, len(frame)))
        return frame["amount"].to_numpy()

    agreement = compare_scores(decisions, offline, score)
    assert sorted(asked) == [(1, 2), (2, 3)]  # one call per deciding version, for its own payments
    assert (agreement.compared, agreement.matched) == (5, 4)
    assert agreement.max_difference == pytest.approx(1e-4)
    assert (agreement.decisions_compared, agreement.decisions_matched) == (4, 3)
    assert [e["transaction_id"] for e in agreement.examples] == ["c", "d"]
    assert agreement.examples[1]["offline_decision"] == "allow"


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
                                                  make_service, window, champion, config):
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
    report = check_consistency(date.fromisoformat(served_day), kafka_config, topic, ingest.raw.root(), factory.PARAMS,
                               registry=config)
    assert (report.scored, report.compared, report.matched) == (len(today), len(today), len(today)), report.examples
    assert report.share == 1.0
    # The served scores and decisions are the registered version's on the rebuilt features.
    scores = report.scores
    assert (scores.compared, scores.matched) == (len(today), len(today)) and scores.max_difference < 1e-6, scores.examples
    assert scores.decisions_compared == scores.decisions_matched == len(today)

    # The check is not blind: rebuilt with another label delay, the merchant fraud rates disagree.
    skewed = check_consistency(date.fromisoformat(served_day), kafka_config, topic, ingest.raw.root(),
                               FeatureParams(label_delay_hours=0.0, label_match_days=90))
    assert skewed.share < 1.0 and any(name.startswith("merchant_fraud_rate") for name in skewed.mismatched_features)
