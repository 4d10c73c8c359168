"""The tier's one routing function (Kafka's murmur2 partitioner), card ownership, the features a
partition keeps, 421 for a card another partition owns, and the batch check the router asks first."""

from __future__ import annotations

import ctypes
from datetime import date

import pytest
from fastapi.testclient import TestClient

from pipeline.config import ConfigError
from pipeline.features import definitions as fd
from pipeline.serving.config import PartitionConfig
from pipeline.serving.consistency import compare
from pipeline.serving.features import FeatureStore, PaymentTimeRules, payment_from_event
from pipeline.serving.partitioning import (
    BATCH_CHECK_PATH,
    Misdirected,
    Ownership,
    kafka_partition,
    murmur2,
    parse_partition,
)
from pipeline.serving.server import ownership_of
from pipeline.serving.service import build_service
from tests.serving import factory
from tests.serving.conftest import app_of, event

# Apache Kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java, testMurmur2.
KAFKA_UTILS_TEST = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
                    b"a-little-bit-longer-string": -1486304829,
                    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
# librdkafka, src/rdmurmur2.c, unittest_murmur2: java_murmur2_results (as int32 bit patterns).
LIBRDKAFKA = {b"kafka": 0xD067CF64, b"giberish123456789": 0x8F552B0C, b"1234": 0x9FC97B14, b"234": 0xE7C009CA,
              b"34": 0x873930DA, b"4": 0x5A4B5CA1, b"PreAmbleWillBeRemoved,ThePrePartThatIs": 0x78424F1C,
              b"reAmbleWillBeRemoved,ThePrePartThatIs": 0x4A62B377, b"eAmbleWillBeRemoved,ThePrePartThatIs": 0xE0E4E09E,
              b"AmbleWillBeRemoved,ThePrePartThatIs": 0x62B8B43F, b"": 0x106E08D9}


@pytest.mark.parametrize("key", list(KAFKA_UTILS_TEST))
def test_murmur2_is_kafkas_utils_murmur2(key):
    assert murmur2(key) == KAFKA_UTILS_TEST[key]


@pytest.mark.parametrize("key", list(LIBRDKAFKA))
def test_murmur2_is_librdkafkas_java_compatible_murmur2(key):
    assert murmur2(key) == ctypes.c_int32(LIBRDKAFKA[key]).value


def test_the_partition_is_to_positive_of_the_hash_modulo_the_partitions():
    # toPositive clears the sign bit (not abs): -790332482 & 0x7fffffff = 1357151166.
    assert [kafka_partition(b"foobar", n) for n in (10, 50, 4)] == [6, 16, 2]


def test_service_partitions_own_topic_partitions_modulo_their_count():
    tier = [Ownership(i, 2, 4) for i in range(2)]
    assert [o.topic_partitions_owned() for o in tier] == [[0, 2], [1, 3]]
    cards = [f"card-{i:08d}" for i in range(400)]
    for card in cards:
        topic_partition = kafka_partition(card.encode(), 4)
        assert [o.owns(card) for o in tier] == [topic_partition % 2 == 0, topic_partition % 2 == 1]
    assert 150 < sum(tier[0].owns(c) for c in cards) < 250  # murmur2 spreads them


@pytest.mark.parametrize("args, message", [((2, 2, 4), "index must be"), ((0, 5, 4), "at most as many"),
                                           ((0, 2, 4, ("a:1",)), "names 1 partitions")])
def test_a_layout_that_cannot_work_is_refused(args, message):
    with pytest.raises(ConfigError, match=message):
        Ownership(*args)


def test_partition_spec_and_config_are_checked():
    assert parse_partition("1/3") == (1, 3)
    for bad in ("3/3", "1", "a/2", "-1/2"):
        with pytest.raises(ConfigError, match="expected I/N"):
            parse_partition(bad)
    with pytest.raises(ConfigError, match="partition.index"):
        PartitionConfig(index=2, count=2)


def test_a_partition_without_kafka_is_refused():
    with pytest.raises(ConfigError, match="run it with Kafka"):
        ownership_of(PartitionConfig(index=0, count=2), None)
    assert ownership_of(PartitionConfig(), None) is None


def test_misdirected_names_the_owner_and_its_address():
    ownership = Ownership(0, 2, 4, ("127.0.0.1:8081", "127.0.0.1:8082"))
    foreign = next(f"card-{i}" for i in range(100) if ownership.owner(f"card-{i}") == 1)
    with pytest.raises(Misdirected) as caught:
        ownership.check([f"card-{i}" for i in range(100) if ownership.owns(f"card-{i}")][:3] + [foreign])
    assert caught.value.status == 421 and caught.value.index == 3
    assert caught.value.body["owner"] == {"partition": 1, "address": "127.0.0.1:8082"}
    assert "127.0.0.1:8082" in caught.value.body["detail"] and caught.value.in_batch().body["index"] == 3


def test_a_partition_keeps_its_own_cards_and_every_merchant(window):
    """Fed the whole stream, each partition's rows for its own cards equal one store's rows, and it
    holds card windows only for its own cards."""
    rows = [event(r) for r in window.transactions.to_dict("records")]
    history, scored = rows[: len(rows) * 3 // 4], rows[len(rows) * 3 // 4:]
    whole = FeatureStore(factory.PARAMS, 24)
    tier = [FeatureStore(factory.PARAMS, 24, ownership=Ownership(i, 2, 4)) for i in range(2)]
    for store in (whole, *tier):
        for row in history:
            store.observe_payment(payment_from_event(row))
    cards = whole.status()["cards"]
    assert [s.status()["cards"] for s in tier] != [cards, cards]
    assert sum(s.status()["cards"] for s in tier) == cards
    assert all(s.status()["merchants"] == whole.status()["merchants"] for s in tier)
    for row in scored:
        owner = tier[0] if tier[0].ownership.owns(row["card_id"]) else tier[1]
        payment = payment_from_event(row)
        assert owner.score_features(payment) == whole.score_features(payment)
        other = tier[1] if owner is tier[0] else tier[0]
        other.observe_payment(payment)  # as it comes back from the topic


def test_a_partitioned_service_answers_421_for_cards_it_does_not_own(serving_config, config, window, champion):
    ownership = Ownership(0, 2, 4, ("127.0.0.1:9001", "127.0.0.1:9002"))
    service = build_service(serving_config, config, factory.PARAMS, None, None, ownership=ownership)
    rows = [event(r) for r in window.transactions.head(60).to_dict("records")]
    mine = [r for r in rows if ownership.owns(r["card_id"])]
    theirs = [r for r in rows if not ownership.owns(r["card_id"])]
    with TestClient(app_of(service)) as http:
        assert http.post("/score", json=mine[0]).status_code == 200
        refused = http.post("/score", json=theirs[0])
        batch = http.post("/score/batch", json={"transactions": [mine[1], theirs[1]]})
        health = http.get("/health").json()
        seen = health["features"]["payments_seen"]
    assert refused.status_code == 421
    assert refused.json()["owner"] == {"partition": 1, "address": "127.0.0.1:9002"}
    assert batch.status_code == 421 and batch.json()["index"] == 1
    assert seen == 1  # nothing of the refused requests reached the features
    assert health["partition"]["owned_topic_partitions"] == [0, 2]


def test_consistency_counts_rows_whose_merchant_features_differ():
    served = {name: 1.0 for name in fd.FEATURE_COLUMNS}
    online = {"a": served, "b": {**served, fd.merchant_count(1): 2.0}, "c": {**served, "amount": 3.0}}
    report = compare(online, {tid: served for tid in online}, date(2026, 3, 1))
    assert (report.matched, report.merchant_mismatched) == (1, 1)
    assert report.to_dict()["merchant_mismatch_share"] == pytest.approx(1 / 3)


def test_the_batch_check_refuses_what_score_batch_would_and_scores_nothing(serving_config, config, window,
                                                                         champion):
    """The router's first pass over a split batch: the same refusals as /score/batch, nothing remembered."""
    ownership = Ownership(0, 2, 4)
    service = build_service(serving_config, config, factory.PARAMS, None, None, ownership=ownership,
                            time_rules=PaymentTimeRules(max_lateness_days=7.0, max_clock_skew_s=300.0))
    rows = [event(r) for r in window.transactions.head(60).to_dict("records")]
    mine = [r for r in rows if ownership.owns(r["card_id"])][:4]
    theirs = next(r for r in rows if not ownership.owns(r["card_id"]))
    future = {**mine[2], "event_time": "2099-01-01T00:00:00Z"}
    with TestClient(app_of(service)) as http:
        checked = http.post(BATCH_CHECK_PATH, json={"transactions": mine})
        misdirected = http.post(BATCH_CHECK_PATH, json={"transactions": [*mine[:3], theirs]})
        mistimed = http.post(BATCH_CHECK_PATH, json={"transactions": [*mine[:2], future]})
        invalid = http.post(BATCH_CHECK_PATH, json={"transactions": [{**mine[0], "amount": -1}]})
        seen = http.get("/health").json()["features"]["payments_seen"]
        scored = http.post("/score/batch", json={"transactions": mine})  # what passed the check scores
    assert checked.status_code == 200 and checked.json() == {"checked": 4}
    assert misdirected.status_code == 421 and misdirected.json()["index"] == 3
    assert mistimed.status_code == 422 and (mistimed.json()["error"], mistimed.json()["index"]) == ("future_event_time", 2)
    assert invalid.status_code == 422 and invalid.json()["index"] == 0
    assert seen == 0  # four checks, and not one payment remembered
    assert scored.status_code == 200 and len(scored.json()["results"]) == 4
