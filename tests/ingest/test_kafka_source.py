"""The Kafka data source on the real embedded broker: exact ranges, the tail, executors' reads."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from pipeline.ingest.config import SourceConfig
from pipeline.ingest.kafka_source import KafkaReadError, read_kafka, read_range, split_range
from pipeline.ingest.offsets import OffsetRange, plan_offset_ranges
from pipeline.kafka.admin import end_offsets
from pipeline.kafka.broker import free_port
from pipeline.kafka.settings import LIBRDKAFKA_LOGGER
from tests.ingest.kafka_helpers import produce

pytestmark = pytest.mark.broker


def test_split_range_covers_the_range_in_order():
    assert split_range(OffsetRange("t", 1, 10, 35), 10) == [
        OffsetRange("t", 1, 10, 20), OffsetRange("t", 1, 20, 30), OffsetRange("t", 1, 30, 35)]
    assert split_range(OffsetRange("t", 1, 5, 5), 10) == []


def _fill(kafka, n_per_partition: int) -> dict[int, list[bytes]]:
    sent = {}
    for p in range(4):
        sent[p] = [f'{{"p":{p},"i":{i}}}'.encode() for i in range(n_per_partition)]
        for start in range(0, n_per_partition, 70):  # several produce calls: several record batches
            produce(kafka, kafka.transactions_topic, [(b"k", v, 1_700_000_000_000 + i)
                                                     for i, v in enumerate(sent[p][start:start + 70])], partition=p)
    return sent


def test_read_range_returns_exactly_the_range_including_the_tail(kafka_config):
    sent = _fill(kafka_config, 300)
    plan = plan_offset_ranges(kafka_config.transactions_topic, {}, end_offsets(kafka_config, kafka_config.transactions_topic))
    assert plan.records == 1200  # the admin helper's end is the true end (broker quirk)
    whole = [b for b in read_range(kafka_config.confluent(), plan.ranges[2], 64, 10.0)]
    assert [o for b in whole for o in b.column("offset").to_pylist()] == list(range(300))
    assert [v for b in whole for v in b.column("value").to_pylist()] == sent[2]
    assert {b.column("timestamp")[0].as_py().year for b in whole} == {2023}
    part = [b for b in read_range(kafka_config.confluent(), OffsetRange(kafka_config.transactions_topic, 1, 100, 250),
                                  1000, 10.0)]
    assert [o for b in part for o in b.column("offset").to_pylist()] == list(range(100, 250))


def test_a_range_past_the_end_fails_with_a_clear_message(kafka_config):
    _fill(kafka_config, 10)
    r = OffsetRange(kafka_config.transactions_topic, 0, 5, 50)
    with pytest.raises(KafkaReadError, match=r"\[0\] stalled at offset 10 \(range ends at 50\)"):
        list(read_range(kafka_config.confluent(), r, 100, stall_timeout_s=2.0))


def test_a_read_from_a_lost_broker_fails_and_logs_through_python_logging_not_stderr(capfd, caplog):
    dead = {"bootstrap.servers": f"127.0.0.1:{free_port()}"}
    with caplog.at_level(logging.INFO, logger=LIBRDKAFKA_LOGGER), pytest.raises(KafkaReadError, match=r"t\[0\]"):
        list(read_range(dead, OffsetRange("t", 0, 0, 10), 100, stall_timeout_s=2.0))
    assert "Connection refused" in caplog.text  # where the run log handler picks them up
    assert "rdkafka" not in capfd.readouterr().err  # librdkafka's own stderr printing is off


@pytest.mark.spark
def test_spark_reads_every_partition_range_on_executors(spark, kafka_config):
    sent = _fill(kafka_config, 120)
    plan = plan_offset_ranges(kafka_config.transactions_topic, {0: 20}, end_offsets(kafka_config, kafka_config.transactions_topic))
    source = dataclasses.replace(SourceConfig(), max_records_per_split=50)  # 100 records -> 2 tasks, 120 -> 3
    df = read_kafka(spark, kafka_config, list(plan.ranges), source)
    assert df.rdd.getNumPartitions() == 2 + 3 * 3
    rows = df.select("partition", "offset", "value", "key").collect()
    got = {(r["partition"], r["offset"]): r["value"] for r in rows}
    expected = {(p, i): v for p, values in sent.items() for i, v in enumerate(values) if p != 0 or i >= 20}
    assert got == expected and len(rows) == len(expected)
    assert {r["key"] for r in rows} == {b"k"}
