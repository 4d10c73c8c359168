"""Our producers place keys where Kafka's Java client does, and where the scoring tier looks for them:
librdkafka with ``partitioner = murmur2_random`` against :func:`pipeline.serving.partitioning.kafka_partition`,
on the real broker."""

from __future__ import annotations

import zlib

import pytest

from pipeline.contract import Kind
from pipeline.kafka.producer import producer_settings, publish_records
from pipeline.kafka.reader import read_topic
from pipeline.serving.partitioning import kafka_partition
from pipeline.simulation import simulate
from tests.kafka.test_producer import TINY

pytestmark = pytest.mark.broker


def test_the_producer_names_the_java_partitioner(kafka_config):
    assert producer_settings(kafka_config, 5.0)["partitioner"] == "murmur2_random"


def test_librdkafka_puts_every_card_where_the_scoring_tier_looks_for_it(kafka_config):
    records = list(simulate(TINY).transaction_records())[:600]
    report = publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, records)
    assert report.ok and report.sent == len(records)
    back = read_topic(kafka_config, kafka_config.transactions_topic)
    placed = {(r.key.decode(), r.partition) for r in back}
    assert len(back) == len(records)
    assert {p for _, p in placed} == set(range(kafka_config.partitions))  # every partition used
    assert placed == {(card, kafka_partition(card.encode(), kafka_config.partitions)) for card, _ in placed}
    # The old default (CRC32) would have put some of these cards elsewhere: the test tells them apart.
    assert any(zlib.crc32(card.encode()) % kafka_config.partitions != p for card, p in placed)
