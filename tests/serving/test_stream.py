"""Kafka on the real broker: the feed keeps the online features equal to the offline ones, every
decision reaches the scores topic, and the shadow model is scored beside the champion."""

from __future__ import annotations

import time
from dataclasses import replace

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.registry.store import CHALLENGER
from pipeline.serving.config import ScoresConfig, StreamConfig
from pipeline.serving.features import FeatureStore, payment_from_event
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.stream import EventFeed
from tests.ingest.kafka_helpers import produce
from tests.serving import factory
from tests.serving.conftest import app_of, event

pytestmark = pytest.mark.broker


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), "timed out"


def records(frame: pd.DataFrame) -> list[dict]:
    return [event(r) for r in frame.to_dict("records")]


def test_the_feed_keeps_online_features_equal_to_the_offline_rows(kafka_config, window):
    split = window.transactions["event_time"].str[:10] < "2026-03-07"
    history, scored = window.transactions[split], window.transactions[~split]
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, records(history)).ok
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, records(window.labels)).ok
    produce(kafka_config, kafka_config.transactions_topic, [(b"k", b'{"schema_version": 1}', None), (b"k", b"{", None)])
    store = FeatureStore(factory.PARAMS, expiry_margin_hours=24)
    feed = EventFeed(store, kafka_config, StreamConfig(seed_from_raw_store=False), raw_root=None)
    feed.start()
    try:
        wait_for(lambda: sum(feed.consumed.values()) == len(history) + len(window.labels))
        wait_for(lambda: sum(feed.rejected.values()) == 2)
        online = {row["transaction_id"]: store.score_features(payment_from_event(row)) for row in records(scored)}
    finally:
        feed.stop()
    assert feed.rejected == {"missing_field": 1, "malformed_json": 1}
    offline = build_feature_frame(window.transactions, window.labels, factory.PARAMS).set_index("transaction_id")
    assert offline.loc[list(online), "merchant_fraud_rate_30d"].gt(0).any()  # the labels mattered
    for tid, features in online.items():
        for name in fd.FEATURE_COLUMNS:
            assert features[name] == pytest.approx(offline.at[tid, name], rel=1e-9, abs=1e-9), (tid, name)


def test_every_decision_reaches_the_scores_topic(kafka_config, serving_config, make_service, window, champion):
    topic = f"scores-{kafka_config.transactions_topic}"
    serving = replace(serving_config, scores=ScoresConfig(topic=topic, create_topic=True),
                      stream=StreamConfig(seed_from_raw_store=False, consume=False))
    rows = records(window.transactions.head(25))
    with TestClient(app_of(make_service(serving, kafka=kafka_config))) as http:
        answers = {a["transaction_id"]: a for a in (http.post("/score", json=row).json() for row in rows)}
        wait_for(lambda: http.get("/health").json()["scores"]["published"] == len(rows))
    published = {e.transaction_id: e for e in (ScoreEvent.from_json(r.value) for r in read_topic(kafka_config, topic))}
    assert published.keys() == answers.keys()
    for tid, answer in answers.items():
        e = published[tid]
        assert (e.model_version, e.score, e.decision) == (answer["model_version"], answer["score"], answer["decision"])
        assert list(e.features) == list(fd.FEATURE_COLUMNS)


def test_shadow_model_is_scored_beside_the_champion_and_never_decides(kafka_config, serving_config, make_service,
                                                                      config, client, logged, models, window,
                                                                      champion):
    challenger = factory.register(config, logged.other)
    client.set_registered_model_alias(config.model_name, CHALLENGER, str(challenger))
    topic = f"scores-{kafka_config.transactions_topic}"
    serving = replace(serving_config, model=replace(serving_config.model, shadow=True),
                      scores=ScoresConfig(topic=topic, create_topic=True))
    rows = records(window.transactions.head(15))
    with TestClient(app_of(make_service(serving, kafka=kafka_config))) as http:
        answers = [http.post("/score", json=row).json() for row in rows]
        wait_for(lambda: http.get("/health").json()["scores"]["published"] == len(rows))
        health = http.get("/health").json()
    assert health["shadow"]["version"] == challenger and health["scores"]["shadow_scored"] == len(rows)
    events = [ScoreEvent.from_json(r.value) for r in read_topic(kafka_config, topic)]
    assert {a["model_version"] for a in answers} == {champion}
    for e in events:
        assert e.shadow.model_version == challenger
        assert e.shadow.score == pytest.approx(factory.score_row(models.other, e.features), rel=1e-5)
        assert e.score == pytest.approx(factory.score_row(models.good, e.features), rel=1e-5)
