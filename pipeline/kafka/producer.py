"""Publish contract events to Kafka: keyed per contract, JSON values, ``acks=all``, batched.

Guarantees of :func:`publish_records`: every record is either acknowledged by the cluster or
counted as failed with its error (never silently dropped); the call returns only after every
delivery report has arrived or the delivery timeout has passed (then the rest count as failed).
The producer is idempotent (no duplicates from internal retries); the embedded Tansu broker
supports this (tests/kafka/test_producer.py publishes with it on). Keys are placed by murmur2, as
the Java client places them (:data:`PARTITIONER`; tests/kafka/test_partitioner.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipeline.contract import Kind, event_key
from pipeline.kafka.admin import KafkaUnavailable, topic_partitions
from pipeline.kafka.settings import KafkaConfig

LINGER_MS = 20  # wait this long to fill a batch: throughput over a few ms of latency
BATCH_BYTES = 1_000_000  # per-partition batch cap (the broker's default max message size is ~1 MB)
QUEUE_MESSAGES = 200_000  # local buffer; produce() waits for deliveries when it is full
MAX_ERRORS_KEPT = 20  # distinct error messages kept in the report (counts are always complete)
# The Java client's default partitioner (murmur2 of the key), not librdkafka's consistent_random (CRC32):
# a payment switch on the Java client and our producers then put a card on the same partition, the one
# pipeline.serving.partitioning computes for the scoring tier.
PARTITIONER = "murmur2_random"


@dataclass
class DeliveryReport:
    """Outcome of one publish: acknowledged and failed counts, and the first distinct errors."""

    topic: str
    sent: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def add_error(self, message: str, count: int = 1) -> None:
        self.failed += count
        if message not in self.errors and len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(message)


def dumps_event(record: dict[str, Any]) -> str:
    """The wire form of an event (also used for JSONL files): compact JSON, non-ASCII kept as UTF-8,
    NaN/Infinity refused (``ValueError``) because they are not JSON."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def producer_settings(kafka: KafkaConfig, delivery_timeout_s: float) -> dict[str, Any]:
    """librdkafka settings: the cluster's connection plus durability and batching choices."""
    return {
        **kafka.confluent(),
        "acks": "all",  # a record counts as sent only once every in-sync replica has it
        "partitioner": PARTITIONER,
        "enable.idempotence": True,  # broker de-duplicates internal retries; keeps per-partition order
        "linger.ms": LINGER_MS,
        "batch.size": BATCH_BYTES,
        "queue.buffering.max.messages": QUEUE_MESSAGES,
        "message.timeout.ms": int(delivery_timeout_s * 1000),
        "socket.connection.setup.timeout.ms": int(min(delivery_timeout_s, kafka.request_timeout_s) * 1000),
    }


def publish_records(kafka: KafkaConfig, topic: str, kind: Kind, records: Iterable[dict[str, Any]],
                    progress: Callable[[int], None] | None = None,
                    delivery_timeout_s: float | None = None) -> DeliveryReport:
    """Publish ``records`` (valid contract events of ``kind``) to ``topic``.

    ``progress(n)`` is called as deliveries are acknowledged or fail (``n`` records at a time).
    ``delivery_timeout_s`` (default: 4x the config's request timeout) bounds how long one record
    may wait for its acknowledgement. Raises ``KafkaUnavailable`` before sending anything when the
    cluster is unreachable or ``topic`` does not exist.
    """
    topic_partitions(kafka, topic)  # fail fast, with an operator-readable message
    timeout_s = delivery_timeout_s or 4 * kafka.request_timeout_s
    report = DeliveryReport(topic)
    try:
        producer = Producer(producer_settings(kafka, timeout_s))
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot create a Kafka producer for {kafka.bootstrap_servers}: {exc}") from exc

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            report.sent += 1
        else:
            report.add_error(f"{err.name()}: {err.str()}")
        if progress:
            progress(1)

    for record in records:
        try:
            value = dumps_event(record).encode("utf-8")
            key = event_key(record, kind)
            _produce(producer, topic, key, value, delivered)
        except (ValueError, KeyError, TypeError, KafkaException) as exc:
            # NaN in an extra field, a missing key field, a record over the size limit: count it.
            report.add_error(f"record not sent: {exc}")
            if progress:
                progress(1)
    undelivered = producer.flush(timeout_s + 5.0)
    if undelivered:
        report.add_error(f"{undelivered} records not acknowledged within {timeout_s + 5.0:.0f}s", undelivered)
        if progress:
            progress(undelivered)
    return report


def _produce(producer: Producer, topic: str, key: bytes, value: bytes,
             on_delivery: Callable[[KafkaError | None, Message], None]) -> None:
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(0.05)  # local queue full: serve delivery reports, then retry
    producer.poll(0)



def topic_for(kafka: KafkaConfig, kind: Kind) -> str:
    """The configured topic of an event kind (names come from kafka.toml, not the contract's defaults)."""
    return kafka.transactions_topic if kind is Kind.TRANSACTION else kafka.labels_topic
