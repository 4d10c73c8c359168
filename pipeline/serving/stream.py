"""The online features' feed: seed from the raw store, then follow the transactions and labels topics.

One background thread (kafka-python, the client the design names). Partitions are assigned
directly, no consumer group and nothing committed: every replica of the service needs every
partition (a request may name any card), and restarting re-seeds from the raw store anyway.
Consumption resumes where the raw store's committed offsets end; without seeding (or for a
partition the store never consumed) it starts at the earliest retained record.

Each record is validated with the event contract; invalid ones are counted by reason and skipped
(ingest quarantines them; here they only must not corrupt the features). A broken connection or
a missing topic is reported on /health and retried; the thread never dies of it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from pipeline.contract import Kind, validate_event
from pipeline.kafka.settings import KafkaConfig
from pipeline.serving.config import StreamConfig
from pipeline.serving.features import FeatureStore, micros, payment_from_event
from pipeline.serving.periodic import BackgroundThread
from pipeline.serving.seed import SeedReport, seed_from_raw_store

log = logging.getLogger(__name__)

RETRY_S = 2.0  # wait before reconnecting after a failure (a missing topic, a broker restart)
MAX_POLL_RECORDS = 500


class EventFeed(BackgroundThread):
    """Keeps a :class:`FeatureStore` current from the raw store and the Kafka topics."""

    def __init__(self, features: FeatureStore, kafka: KafkaConfig, config: StreamConfig,
                 raw_root: Path | None) -> None:
        super().__init__("event-feed")
        self.features = features
        self.kafka = kafka
        self.config = config
        self.raw_root = raw_root if config.seed_from_raw_store else None
        self._kinds = {kafka.transactions_topic: Kind.TRANSACTION, kafka.labels_topic: Kind.LABEL}
        self.seed: SeedReport | None = None
        self.seeded = threading.Event()  # set once seeding is done (or not configured)
        self.consumed: Counter[str] = Counter()  # topic -> valid records applied
        self.rejected: Counter[str] = Counter()  # reject reason -> records skipped
        self.positions: dict[str, int] = {}  # "topic[partition]" -> next offset
        self.last_error: str | None = None

    def _run(self) -> None:
        start_offsets: dict[str, dict[int, int]] = {}
        if self.raw_root is not None:
            try:
                self.seed = seed_from_raw_store(self.features, self.raw_root)
                start_offsets = self.seed.offsets
                log.info("seeded features from %s: %d payments, %d labels since %s", self.raw_root,
                         self.seed.payments, self.seed.labels, self.seed.since)
            except Exception as exc:  # an unreadable store: serve on what Kafka still holds
                self.last_error = f"seeding from {self.raw_root} failed ({type(exc).__name__}: {exc})"
                log.exception("seeding the online features failed")
        self.seeded.set()
        if not self.config.consume:
            return
        while not self._stop.is_set():
            try:
                self._consume(start_offsets)
            except Exception as exc:  # kafka-python raises many types; all mean "reconnect later"
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("event feed: %s; retrying in %.0fs", self.last_error, RETRY_S)
                self._stop.wait(RETRY_S)
            # Resume where this process got to, not where the raw store ended.
            start_offsets = self._resume_offsets()

    def _resume_offsets(self) -> dict[str, dict[int, int]]:
        out: dict[str, dict[int, int]] = {}
        for key, offset in self.positions.items():
            topic, _, partition = key.rstrip("]").rpartition("[")
            out.setdefault(topic, {})[int(partition)] = offset
        return out

    def _consume(self, start_offsets: dict[str, dict[int, int]]) -> None:
        consumer = KafkaConsumer(**self.kafka.kafka_python(), group_id=None, enable_auto_commit=False,
                                 client_id="fraud-scoring-feed")
        try:
            assigned = self._assign(consumer, start_offsets)
            self.last_error = None
            while not self._stop.is_set():
                batches = consumer.poll(timeout_ms=self.config.poll_timeout_ms, max_records=MAX_POLL_RECORDS)
                for tp, records in batches.items():
                    kind = self._kinds[tp.topic]
                    for record in records:
                        self._apply(record.value, kind, tp.topic)
                # One new dict, swapped in: status() may read it from another thread meanwhile.
                self.positions = {f"{tp.topic}[{tp.partition}]": consumer.position(tp) for tp in assigned}
        finally:
            consumer.close()

    def _assign(self, consumer: KafkaConsumer, start_offsets: dict[str, dict[int, int]]) -> list[TopicPartition]:
        assigned = []
        for topic in self._kinds:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise RuntimeError(f"topic {topic!r} does not exist on {self.kafka.bootstrap_servers} "
                                   "(check kafka.toml topic names)")
            assigned += [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        for tp in assigned:
            offset = start_offsets.get(tp.topic, {}).get(tp.partition)
            if offset is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
        return assigned

    def _apply(self, value: bytes | None, kind: Kind, topic: str) -> None:
        event, rejection = validate_event(value if value is not None else b"", kind)
        if rejection is not None:
            self.rejected[rejection.reason.value] += 1
            return
        if kind is Kind.TRANSACTION:
            self.features.observe_payment(payment_from_event(event))
        else:
            self.features.observe_label(event["transaction_id"], event["is_fraud"], micros(event["reported_at"]))
        self.consumed[topic] += 1

    def status(self) -> dict[str, Any]:
        return {"seeded": self.seeded.is_set(),
                "seed": None if self.seed is None else {"payments": self.seed.payments, "labels": self.seed.labels,
                                                         "since": str(self.seed.since) if self.seed.since else None},
                "consumed": dict(self.consumed), "rejected": dict(self.rejected),
                "positions": dict(sorted(self.positions.items())), "last_error": self.last_error,
                "consuming": self.config.consume and self._thread.is_alive()}
