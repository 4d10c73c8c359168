"""Cluster-level Kafka operations: readiness, topics, and offset ranges that do not lose the tail.

Offsets: some brokers (the embedded Tansu among them) answer ListOffsets(latest) with the base
offset of the last record batch rather than the true end. :func:`end_offsets` therefore takes
the high watermark from a real Fetch response, which is right on every broker we know of.

Every client here logs through :data:`pipeline.kafka.settings.LIBRDKAFKA_LOGGER`, not stderr, and
is closed before its function returns. A librdkafka handle left to Python's cyclic GC is destroyed on
whichever thread the collection runs, possibly one of librdkafka's own (an admin future's callback
runs there), which crashes the interpreter (confluent-kafka-python #1761). An exception raised here
holds its frame, and so the client, in such a cycle: hence ``with`` for every client, never GC.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline.kafka.settings import KafkaConfig, with_log_routing


class KafkaUnavailable(RuntimeError):
    """The cluster cannot be reached or a topic is missing; the message says what to check."""


def wait_until_ready(bootstrap_servers: str, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Block until the broker answers a metadata request, or raise ``KafkaUnavailable``."""
    deadline = time.monotonic() + timeout_s
    # Wait for the listening socket first: librdkafka would log every refused connection attempt.
    host, _, port = bootstrap_servers.split(",")[0].rpartition(":")
    while time.monotonic() < deadline and alive():
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.05)
    last = ""  # the error's text, not the exception: that would hold this frame, and the client, in a cycle
    with AdminClient(with_log_routing({"bootstrap.servers": bootstrap_servers})) as admin:
        while time.monotonic() < deadline:
            if not alive():
                raise KafkaUnavailable(f"broker process at {bootstrap_servers} exited during start-up")
            try:
                admin.list_topics(timeout=1.0)
                return
            except KafkaException as exc:
                last = str(exc)
                time.sleep(0.1)
            finally:
                admin.poll(0)  # hand the queued log lines to the logger
    raise KafkaUnavailable(f"no Kafka broker answered at {bootstrap_servers} within {timeout_s:.0f}s ({last})")


def create_topics(kafka: KafkaConfig, topics: tuple[str, ...], partitions: int) -> None:
    """Create ``topics`` with ``partitions`` partitions; existing topics are left as they are."""
    with _admin(kafka) as admin:
        existing = set(_list_topics(admin, kafka).topics)
        wanted = [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics if t not in existing]
        if not wanted:
            return
        try:
            for topic, future in admin.create_topics(wanted, request_timeout=kafka.request_timeout_s).items():
                try:
                    future.result()
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise KafkaUnavailable(
                            f"could not create topic {topic!r} on {kafka.bootstrap_servers}: {exc}") from exc
        finally:
            admin.poll(0)


def _admin(kafka: KafkaConfig) -> AdminClient:
    return AdminClient(with_log_routing(kafka.confluent()))


def _list_topics(admin: AdminClient, kafka: KafkaConfig):
    try:
        return admin.list_topics(timeout=kafka.request_timeout_s)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"Kafka at {kafka.bootstrap_servers} is unreachable ({exc}); start the embedded broker with "
            f"`fraudctl broker start` or set KAFKA_BOOTSTRAP_SERVERS / --bootstrap-servers"
        ) from exc
    finally:
        admin.poll(0)  # an AdminClient delivers its queued log lines only when polled


def topic_exists(kafka: KafkaConfig, topic: str) -> bool:
    """Whether ``topic`` exists (and reads without error); ``KafkaUnavailable`` if the cluster cannot be reached."""
    with _admin(kafka) as admin:
        md = _list_topics(admin, kafka)
    return topic in md.topics and md.topics[topic].error is None


def topic_partitions(kafka: KafkaConfig, topic: str) -> list[int]:
    """Partition ids of ``topic``; ``KafkaUnavailable`` if the topic does not exist."""
    with _admin(kafka) as admin:
        md = _list_topics(admin, kafka)
    if topic not in md.topics or md.topics[topic].error is not None:
        raise KafkaUnavailable(
            f"topic {topic!r} does not exist on {kafka.bootstrap_servers}; create it (`fraudctl broker start` "
            f"creates the configured topics) or fix the topic name in conf/<env>/kafka.toml"
        )
    return sorted(md.topics[topic].partitions)


def end_offsets(kafka: KafkaConfig, topic: str) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` where ``high`` is one past the last record, taken once now.

    ListOffsets may under-report ``high`` (see module doc), so for each partition with data we
    fetch one record at the listed end and read the high watermark the Fetch response carries.
    """
    partitions = topic_partitions(kafka, topic)
    consumer = Consumer(with_log_routing({**kafka.confluent(), "group.id": "fraud-pipeline-offset-probe",
                                          "enable.auto.commit": False, "enable.partition.eof": True}))
    try:
        result: dict[int, tuple[int, int]] = {}
        for p in partitions:
            low, listed = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=kafka.request_timeout_s)
            result[p] = (low, listed)
        probe = [TopicPartition(topic, p, max(low, hi - 1)) for p, (low, hi) in result.items() if hi > low]
        if probe:
            consumer.assign(probe)
            pending = {tp.partition for tp in probe}
            deadline = time.monotonic() + kafka.request_timeout_s
            while pending and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error() and msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaUnavailable(f"fetch from {topic}[{msg.partition()}] failed: {msg.error()}")
                p = msg.partition()
                if p in pending:
                    _, fetched_high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                    low = result[p][0]
                    result[p] = (low, max(fetched_high, result[p][1]))
                    pending.discard(p)
            if pending:
                raise KafkaUnavailable(f"could not read the high watermark of {topic} partitions {sorted(pending)} "
                                       f"within {kafka.request_timeout_s}s")
        return result
    finally:
        consumer.close()
