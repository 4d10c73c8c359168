"""Offset planning against the real broker, including its under-reporting ListOffsets."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from pipeline.kafka.admin import (
    KafkaUnavailable,
    create_topics,
    end_offsets,
    topic_exists,
    topic_partitions,
    wait_until_ready,
)
from pipeline.kafka.settings import KafkaConfig


def _produce(kafka: KafkaConfig, topic: str, per_partition: dict[int, int]) -> None:
    producer = Producer({**kafka.confluent(), "linger.ms": 20})
    for partition, count in per_partition.items():
        for i in range(count):
            producer.produce(topic, value=f'{{"i": {i}}}'.encode(), partition=partition)
    assert producer.flush(15) == 0


def test_end_offsets_cover_every_record_even_when_list_offsets_under_reports(kafka_config):
    topic = kafka_config.transactions_topic
    counts = {0: 2500, 1: 1, 2: 0, 3: 777}
    _produce(kafka_config, topic, counts)
    ends = end_offsets(kafka_config, topic)
    assert {p: hi - lo for p, (lo, hi) in ends.items()} == counts

    # What the workaround is for: the broker's own ListOffsets answer is not the true end.
    consumer = Consumer({**kafka_config.confluent(), "group.id": "probe"})
    listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    consumer.close()
    assert listed <= counts[0]


def test_missing_topic_and_unreachable_broker_are_explained(kafka_config):
    with pytest.raises(KafkaUnavailable, match="does not exist"):
        topic_partitions(kafka_config, "no-such-topic")
    dead = KafkaConfig(bootstrap_servers="127.0.0.1:1", request_timeout_s=1.0)
    with pytest.raises(KafkaUnavailable, match="unreachable"):
        topic_partitions(dead, "transactions")


def test_topic_exists_tells_a_missing_topic_from_an_unreachable_broker(kafka_config):
    assert topic_exists(kafka_config, kafka_config.transactions_topic)
    assert not topic_exists(kafka_config, "no-such-topic")
    dead = KafkaConfig(bootstrap_servers="127.0.0.1:1", request_timeout_s=1.0)
    with pytest.raises(KafkaUnavailable, match="unreachable"):
        topic_exists(dead, "transactions")


def _clients_in(exc: BaseException) -> list[AdminClient]:
    """The admin clients that the frames of ``exc``'s traceback hold: what a kept exception keeps alive."""
    frames, tb = [], exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return [v for f in frames for v in f.f_locals.values() if isinstance(v, AdminClient)]


def test_a_failed_call_leaves_no_open_client_for_the_garbage_collector():
    # A kept exception holds its frames in a cycle; a librdkafka handle they hold would be destroyed on
    # whatever thread the collection runs, a librdkafka thread among them: a crash (the CI segfault).
    dead = KafkaConfig(bootstrap_servers="127.0.0.1:1", request_timeout_s=0.5)
    failures = []
    for call in (lambda: topic_partitions(dead, "transactions"), lambda: create_topics(dead, ("t",), 1),
                 lambda: wait_until_ready(dead.bootstrap_servers, timeout_s=1.0), lambda: topic_exists(dead, "t")):
        with pytest.raises(KafkaUnavailable) as caught:
            call()
        failures.append(caught.value)
    clients = {id(c): c for exc in failures for c in _clients_in(exc)}
    assert len(clients) == 4  # one client per call
    for client in clients.values():
        with pytest.raises(RuntimeError, match="closed"):
            client.list_topics(timeout=0.1)
