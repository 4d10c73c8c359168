"""Read a whole topic as it is now: every partition from its low offset to the high watermark.

Partitions are assigned directly (no consumer group, nothing committed), so reading never moves
anyone's offsets. The end of each partition comes from :func:`pipeline.kafka.admin.end_offsets`,
which is right even on brokers whose ListOffsets under-reports. Used by the round-trip tests and
the demo; Spark ingest has its own reader.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from pipeline.kafka.admin import KafkaUnavailable, end_offsets
from pipeline.kafka.settings import KafkaConfig

_BATCH = 1000


@dataclass(frozen=True)
class ConsumedRecord:
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


def read_topic(kafka: KafkaConfig, topic: str, timeout_s: float | None = None) -> list[ConsumedRecord]:
    """All records of ``topic`` up to the end offsets taken at the start of the call, ordered by
    (partition, offset). Records written after that snapshot are not included.

    Raises ``KafkaUnavailable`` if the cluster is unreachable, the topic is missing, or the records
    cannot all be read within ``timeout_s`` (default: 4x the config's request timeout).
    """
    ranges = {p: (low, high) for p, (low, high) in end_offsets(kafka, topic).items() if high > low}
    if not ranges:
        return []
    consumer = Consumer({**kafka.confluent(), "group.id": "fraud-pipeline-topic-reader",
                         "enable.auto.commit": False, "enable.auto.offset.store": False})
    try:
        consumer.assign([TopicPartition(topic, p, low) for p, (low, _) in ranges.items()])
        return _read_ranges(consumer, topic, ranges, timeout_s or 4 * kafka.request_timeout_s)
    finally:
        consumer.close()


def _read_ranges(consumer: Consumer, topic: str, ranges: dict[int, tuple[int, int]],
                 timeout_s: float) -> list[ConsumedRecord]:
    records: list[ConsumedRecord] = []
    next_offset = {p: low for p, (low, _) in ranges.items()}
    pending = set(ranges)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for msg in consumer.consume(_BATCH, timeout=0.5):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaUnavailable(f"reading {topic}[{msg.partition()}] failed: {msg.error()}")
            p, offset = msg.partition(), msg.offset()
            if offset >= ranges[p][1]:
                continue  # written after the snapshot
            records.append(ConsumedRecord(p, offset, msg.timestamp()[1], msg.key(), msg.value()))
            next_offset[p] = offset + 1
            if next_offset[p] >= ranges[p][1]:
                pending.discard(p)
    if pending:
        missing = {p: f"{next_offset[p]}..{ranges[p][1] - 1}" for p in sorted(pending)}
        raise KafkaUnavailable(f"could not read {topic} to its end within {timeout_s:.0f}s; unread offsets {missing}")
    records.sort(key=lambda r: (r.partition, r.offset))
    return records
