"""Kafka on the real broker: the feed keeps the online features equal to the offline ones, every
decision reaches the scores topic, and the shadow model is scored beside the champion; positions
beyond a recreated topic's end, a stalled feed and a broker gone away turn /health degraded
(stream.on_offset_gap), and decisions the scores topic never got are a warning."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pandas as pd
import pytest
from confluent_kafka.admin import AdminClient
from fastapi.testclient import TestClient

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.ingest.offsets import OffsetPlan, OffsetRange, OffsetStore
from pipeline.kafka.admin import create_topics
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.store import CHALLENGER
from pipeline.serving.config import ScoresConfig, ServingConfig, StreamConfig
from pipeline.serving.features import FeatureStore, PaymentTimeRules, payment_from_event
from pipeline.serving.prometheus import render, service_registry
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.stream import EventFeed
from pipeline.serving.telemetry import stream_families
from tests.ingest.kafka_helpers import event_bytes, produce
from tests.serving import factory
from tests.serving.conftest import FakeClock, app_of, event
from tests.serving.scrape import samples, value

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
    # Valid records ingest would quarantine by time: they must not reach the features either.
    payment, label = records(history)[0], records(window.labels)[0]
    mistimed = [{**payment, "transaction_id": "tx-from-9999", "event_time": "9999-12-31T00:00:00Z"},
                {**payment, "transaction_id": "tx-from-1970", "event_time": "1970-01-01T00:00:00Z"}]
    produce(kafka_config, kafka_config.transactions_topic, [(b"k", event_bytes(e), None) for e in mistimed], partition=0)
    produce(kafka_config, kafka_config.labels_topic,
            [(b"k", event_bytes({**label, "reported_at": "9999-12-31T00:00:00Z"}), None)], partition=0)
    store = FeatureStore(factory.PARAMS, expiry_margin_hours=24)
    feed = EventFeed(store, kafka_config, StreamConfig(seed_from_raw_store=False), raw_root=None,
                     time_rules=PaymentTimeRules(max_lateness_days=7.0, max_clock_skew_s=300.0))
    feed.start()
    try:
        wait_for(lambda: sum(feed.consumed.values()) == len(history) + len(window.labels))
        wait_for(lambda: sum(feed.rejected.values()) == 5)
        online = {row["transaction_id"]: store.score_features(payment_from_event(row)) for row in records(scored)}
    finally:
        feed.stop()
    assert feed.rejected == {"missing_field": 1, "malformed_json": 1, "future_event_time": 2, "late_event": 1}
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


# -- positions out of range, stalls -------------------------------------------------------------------
def produce_rows(kafka, topic: str, rows: list[dict]) -> None:
    """Into partition 0, so that offsets are exactly the rows' order."""
    produce(kafka, topic, [(r["card_id"].encode(), event_bytes(r), None) for r in rows], partition=0)


def recreate_topic(kafka, topic: str) -> None:
    """What a broker restart with in-memory storage does to a topic: it comes back empty."""
    with AdminClient({"bootstrap.servers": kafka.bootstrap_servers}) as admin:  # never destroyed by GC
        for future in admin.delete_topics([topic]).values():
            future.result()
        wait_for(lambda: topic not in admin.list_topics(timeout=5).topics, 30)
    create_topics(kafka, (topic,), kafka.partitions)


def watched(serving: ServingConfig, policy: str, **stream) -> ServingConfig:
    return replace(serving, scores=ScoresConfig(publish=False),
                   stream=StreamConfig(on_offset_gap=policy, watch_interval_s=0.2, **stream))


def test_positions_beyond_the_end_degrade_health_until_the_topic_reaches_them(
        kafka_config, serving_config, make_service, window, champion, tmp_path):
    # The case: the broker restarted empty, the raw store's committed offsets are from before.
    topic = kafka_config.transactions_topic
    raw = tmp_path / "raw"
    OffsetStore(raw).commit("before-the-restart", [OffsetPlan(topic, (OffsetRange(topic, 0, 0, 40),))])
    rows = records(window.transactions.head(45))
    serving = watched(serving_config, "wait", seed_from_raw_store=True)
    with TestClient(app_of(make_service(serving, kafka=kafka_config, raw_root=raw))) as http:
        produce_rows(kafka_config, topic, rows[:25])
        wait_for(lambda: http.get("/health").json()["status"] == "degraded")
        health = http.get("/health").json()
        [reason] = health["degraded"]
        assert reason.startswith(f"event feed: {topic}[0]: the committed offset 40 is beyond the end 25")
        assert "--allow-data-loss" in reason and f"waits until {topic}[0] reaches offset 40" in reason
        assert health["stream"]["positions"][f"{topic}[0]"] == 40 and health["stream"]["consumed"] == {}
        metrics = http.get("/metrics").text
        [gap] = [dict(labels) for (name, labels), n in samples(metrics).items()
                 if name == "fraud_scoring_stream_out_of_range" and n == 1]
        assert {k: gap[k] for k in ("topic", "partition", "position", "earliest", "end", "policy")} == {
            "topic": topic, "partition": "0", "position": "40", "earliest": "0", "end": "25", "policy": "wait"}
        assert gap["detail"].startswith(f"{topic}[0]: the committed offset 40 is beyond the end 25")
        assert value(metrics, "fraud_scoring_stream_degraded") == 1
        produce_rows(kafka_config, topic, rows[25:])  # the end reaches 45: offsets 40..44 are the feed's
        wait_for(lambda: http.get("/health").json()["stream"]["consumed"].get(topic) == 5)
        wait_for(lambda: http.get("/health").json()["status"] == "ok")
        assert value(http.get("/metrics").text, "fraud_scoring_stream_degraded") == 0


def test_earliest_resumes_a_topic_recreated_under_the_feed_and_records_the_jump(
        kafka_config, serving_config, make_service, window, champion, caplog):
    topic = kafka_config.transactions_topic
    rows = records(window.transactions.head(40))
    with TestClient(app_of(make_service(watched(serving_config, "earliest", seed_from_raw_store=False),
                                        kafka=kafka_config))) as http:
        produce_rows(kafka_config, topic, rows[:30])
        wait_for(lambda: http.get("/health").json()["stream"]["consumed"].get(topic) == 30)
        recreate_topic(kafka_config, topic)
        produce_rows(kafka_config, topic, rows[30:])  # end 10, the feed at 30
        wait_for(lambda: http.get("/health").json()["stream"]["consumed"][topic] == 40)  # all 10 new ones
        wait_for(lambda: http.get("/health").json()["status"] == "ok")
        stream = http.get("/health").json()["stream"]
        metrics = http.get("/metrics").text
    [reset] = stream["resets"]
    assert (reset["topic"], reset["partition"], reset["from_offset"], reset["to_offset"], reset["skipped"]) == (
        topic, 0, 30, 0, 0)
    assert "the committed offset 30 is beyond the end" in reset["detail"]  # 0 or 10: when the probe ran
    assert stream["positions"][f"{topic}[0]"] == 10
    assert value(metrics, "fraud_scoring_stream_offset_resets_total", topic=topic, partition="0") == 1
    assert value(metrics, "fraud_scoring_stream_last_offset_reset_timestamp_seconds", topic=topic, partition="0",
                 from_offset="30", to_offset="0") > 0
    assert f"moved {topic}[0] from offset 30 to the earliest offset 0" in caplog.text


class GatedFeatures(FeatureStore):
    """Applies payments only while ``gate`` is set: a feed thread stuck in the middle of a batch."""

    def __init__(self) -> None:
        super().__init__(factory.PARAMS, expiry_margin_hours=24)
        self.gate = threading.Event()
        self.gate.set()

    def observe_payment(self, payment) -> None:
        self.gate.wait()
        super().observe_payment(payment)


def test_a_feed_that_stops_while_its_topic_grows_is_degraded_until_it_moves(kafka_config, window):
    topic = kafka_config.transactions_topic
    rows = records(window.transactions.head(30))
    clock, features = FakeClock(), GatedFeatures()
    feed = EventFeed(features, kafka_config, StreamConfig(seed_from_raw_store=False, stall_after_s=60),
                     raw_root=None, clock=clock)
    feed.start()
    try:
        produce_rows(kafka_config, topic, rows[:10])
        wait_for(lambda: feed.positions.get(f"{topic}[0]") == 10)
        feed.check_offsets()  # caught up at 10
        features.gate.clear()
        produce_rows(kafka_config, topic, rows[10:20])  # the feed takes them and blocks on the first
        produce_rows(kafka_config, topic, rows[20:])
        clock.advance(30)
        feed.check_offsets()
        assert feed.status()["degraded"] == []  # not for long enough yet
        clock.advance(31)
        feed.check_offsets()
        [reason] = feed.status()["degraded"]
        assert f"{topic}[0] has stayed at offset 10 for 61s while its end grew from 10 to 30 (lag 20)" in reason
        stalled = render(service_registry(lambda: stream_families(feed)))
        assert value(stalled, "fraud_scoring_stream_stalled", topic=topic, partition="0") == 1
        features.gate.set()
        wait_for(lambda: feed.consumed[topic] == 30)
        assert feed.status()["degraded"] == []
    finally:
        features.gate.set()
        feed.stop()


def test_a_broker_that_goes_away_degrades_health_warns_of_lost_decisions_and_scoring_goes_on(
        serving_config, make_service, window, champion, tmp_path, monkeypatch):
    # An operator's trial: the broker stopped under a running service. Scoring must not stop; /health
    # must say the features go stale and that decisions are missing from the scores topic.
    monkeypatch.setattr("pipeline.serving.publisher.DELIVERY_TIMEOUT_S", 2.0)
    broker = EmbeddedBroker("127.0.0.1", free_port(), tmp_path / "broker.log")  # ours alone: it gets stopped
    broker.start()
    try:
        # A short request timeout: the feed finds the broker gone in seconds, not the 15 s default.
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers, partitions=1, request_timeout_s=3.0)
        broker.create_topics(kafka.topics(), kafka.partitions)
        serving = replace(serving_config, scores=ScoresConfig(topic="scores", create_topic=True),
                          stream=StreamConfig(seed_from_raw_store=False, watch_interval_s=0.2))
        rows = records(window.transactions.head(3))
        with TestClient(app_of(make_service(serving, kafka=kafka))) as http:
            assert http.post("/score", json=rows[0]).status_code == 200
            wait_for(lambda: http.get("/health").json()["scores"]["published"] == 1)
            health = http.get("/health").json()
            assert health["status"] == "ok" and not [w for w in health["warnings"] if w.startswith("scores topic")]
            broker.stop()
            wait_for(lambda: http.get("/health").json()["status"] == "degraded")
            [reason] = http.get("/health").json()["degraded"]
            assert reason.startswith("event feed: cannot read the topics (") and "until Kafka answers" in reason
            assert value(http.get("/metrics").text, "fraud_scoring_stream_degraded") == 1
            answer = http.post("/score", json=rows[1])
            assert answer.status_code == 200 and answer.json()["transaction_id"] == rows[1]["transaction_id"]
            wait_for(lambda: http.get("/health").json()["scores"]["failed"] == 1, timeout_s=30)
            [warning] = [w for w in http.get("/health").json()["warnings"] if w.startswith("scores topic")]
            assert warning.startswith("scores topic 'scores': 1 decision(s) failed delivery and 0 were dropped")
            assert "the monitor does not see them" in warning
    finally:
        broker.stop()
