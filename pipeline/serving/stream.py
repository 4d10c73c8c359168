"""The online features' feed: seed from the raw store, then follow the transactions and labels topics.

One background thread (kafka-python, the client the design names). Partitions are assigned
directly, no consumer group and nothing committed: every replica of the service needs every
partition (a request may name any card), and restarting re-seeds from the raw store anyway.
Consumption resumes where the raw store's committed offsets end; without seeding (or for a
partition the store never consumed) it starts at the earliest retained record.

Each record is validated with the event contract, then, with ``time_rules``, judged by ingest's
timing rules as ingest judges it (:mod:`pipeline.ingest.timing`): ``future_event_time`` against the
record's Kafka timestamp, ``late_event`` (payments only) against its partition's watermark, the
latest accepted payment time the feed has read from that partition (a restart starts the watermark
afresh: ingest's committed one is not carried over). Refused records are counted by reason and
skipped (ingest quarantines them; here they only must not corrupt the features). A broken connection or
a missing topic is reported on /health and retried; the thread never dies of it.

A position can stop making sense (the topic was recreated, or retention deleted what the feed had
not read yet) without any error from the broker; and the thread itself can stall. So
:meth:`EventFeed.check_offsets`, run every ``stream.watch_interval_s`` on a thread of its own, reads
every partition's offsets and lets :class:`.stream_watch.StreamWatch` judge the positions: /health
turns degraded while one is out of range or stalled, or while the offsets cannot be read (a broker
down: the features then miss what is sent meanwhile). Under ``stream.on_offset_gap = "earliest"`` the
feed thread then moves an out-of-range position to the partition's earliest offset (recorded, with
the skipped range); under ``"wait"`` it stays put until the partition reaches it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import OffsetOutOfRangeError

from pipeline.contract import TIME_FIELD_BY_KIND, Kind, Rejection, validate_event
from pipeline.kafka.admin import end_offsets
from pipeline.kafka.settings import KafkaConfig
from pipeline.serving.config import StreamConfig
from pipeline.serving.features import FeatureStore, PaymentTimeRules, micros, payment_from_event
from pipeline.serving.periodic import BackgroundThread
from pipeline.serving.seed import SeedReport, seed_from_raw_store
from pipeline.serving.stream_watch import OffsetGap, StreamWatch, WatchReport, describe_gap, partition_name

log = logging.getLogger(__name__)

RETRY_S = 2.0  # wait before reconnecting after a failure (a missing topic, a broker restart)
MAX_POLL_RECORDS = 500


class EventFeed(BackgroundThread):
    """Keeps a :class:`FeatureStore` current from the raw store and the Kafka topics.

    ``clock`` (seconds, monotonic) times stalls (:class:`.stream_watch.StreamWatch`)."""

    def __init__(self, features: FeatureStore, kafka: KafkaConfig, config: StreamConfig,
                 raw_root: Path | None, clock: Callable[[], float] = time.monotonic,
                 time_rules: PaymentTimeRules | None = None, on_seeded: Callable[[], None] | None = None) -> None:
        super().__init__("event-feed")
        self.on_seeded = on_seeded  # called once the seed is done (the live versions' thresholds start there)
        self.features = features
        # Ingest's own references whatever /score is judged against: the record's timestamp, the partition.
        self.time_rules = (None if time_rules is None else
                           dataclasses.replace(time_rules, late_against="watermark", future_against="clock"))
        self._watermarks: dict[TopicPartition, int] = {}  # latest accepted payment time per partition
        self.kafka = kafka
        self.config = config
        self.raw_root = raw_root if config.seed_from_raw_store else None
        self._kinds = {kafka.transactions_topic: Kind.TRANSACTION, kafka.labels_topic: Kind.LABEL}
        self.seed: SeedReport | None = None
        self.seeded = threading.Event()  # set once seeding is done (or not configured)
        self.consumed: Counter[str] = Counter()  # topic -> valid records applied
        self.rejected: Counter[str] = Counter()  # reject reason -> records skipped
        self.last_error: str | None = None
        self.watch = StreamWatch(config.stall_after_s, clock)
        # Next offset per partition. Only the feed thread writes it, always as a new dict swapped in:
        # the probe and /health read it from other threads meanwhile.
        self._positions: dict[TopicPartition, int] = {}
        self._resets_wanted: dict[TopicPartition, OffsetGap] = {}  # from the probe, for the feed thread
        self._resets_lock = threading.Lock()
        self._held: dict[TopicPartition, int] = {}  # paused as out of range -> watch.probes at the time
        self._warned: set[tuple[str, int, int]] = set()  # gaps already logged: (topic, partition, position)

    @property
    def positions(self) -> dict[str, int]:
        """``{"topic[partition]": next offset}`` of every assigned partition."""
        return {partition_name(tp): offset for tp, offset in self._positions.items()}

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
        if self.on_seeded is not None:
            try:
                self.on_seeded()
            except Exception:  # a threshold left at its validation value must not stop the feed
                log.exception("starting the live versions' review thresholds from the seeded traffic failed")
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
        for tp, offset in self._positions.items():
            out.setdefault(tp.topic, {})[tp.partition] = offset
        return out

    def _consume(self, start_offsets: dict[str, dict[int, int]]) -> None:
        # auto_offset_reset "none": a broker that refuses an out-of-range fetch must not send the
        # position silently to the end ("latest") or the start; the watch judges it (_poll).
        consumer = KafkaConsumer(**self.kafka.kafka_python(), group_id=None, enable_auto_commit=False,
                                 auto_offset_reset="none", client_id="fraud-scoring-feed")
        try:
            assigned = self._assign(consumer, start_offsets)
            self._held.clear()  # a new consumer holds nothing
            self.last_error = None
            while not self._stop.is_set():
                self._act_on_watch(consumer, assigned)
                for tp, records in self._poll(consumer).items():
                    kind = self._kinds[tp.topic]
                    for record in records:
                        self._apply(record.value, kind, tp, record.timestamp)
                self._positions = {tp: consumer.position(tp) for tp in assigned}
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

    def _poll(self, consumer: KafkaConsumer) -> dict[TopicPartition, list[Any]]:
        try:
            return consumer.poll(timeout_ms=self.config.poll_timeout_ms, max_records=MAX_POLL_RECORDS)
        except OffsetOutOfRangeError as exc:
            # Kafka refuses a fetch outside the partition (the embedded broker answers it empty). Pause
            # just those partitions, so the others go on, until the watch has judged them (_act_on_watch).
            out = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
            consumer.pause(*out)
            self._held.update({tp: self.watch.probes for tp in out})
            log.warning("event feed: the broker refused offsets %s as out of range; holding them for the "
                        "offset check", {partition_name(tp): offset for tp, offset in out.items()})
            return {}

    def _act_on_watch(self, consumer: KafkaConsumer, assigned: list[TopicPartition]) -> None:
        """Move the positions the probe asked to move (policy "earliest"), and release held partitions
        that a probe made after they were held found in range."""
        with self._resets_lock:
            wanted, self._resets_wanted = self._resets_wanted, {}
        for tp, gap in wanted.items():
            # Moved since it was judged (or no longer assigned): the judgement is stale, never act on it.
            if tp not in assigned or consumer.position(tp) != gap.position:
                continue
            consumer.seek(tp, gap.low)
            consumer.resume(tp)
            self._held.pop(tp, None)
            reset = self.watch.record_reset(gap, gap.low)
            log.warning("event feed: moved %s from offset %d to the earliest offset %d (%d records known lost; "
                        'stream.on_offset_gap = "earliest"): %s', partition_name(tp), reset.from_offset,
                        reset.to_offset, reset.skipped, gap.detail)
        for tp, probes_then in list(self._held.items()):
            if self.watch.probes > probes_then and not self.watch.has_gap(tp):
                consumer.resume(tp)
                del self._held[tp]

    def check_offsets(self) -> None:
        """Read every partition's earliest and end offsets, let the watch judge the positions, and under
        ``on_offset_gap = "earliest"`` ask the feed thread to move the out-of-range ones.

        Runs on the caller's thread (network I/O: a Periodic of the service); a failed read is recorded
        on the watch, never raised. The end offsets come from :func:`pipeline.kafka.admin.end_offsets`,
        which reads them from a fetch: the embedded broker's ListOffsets under-reports the end."""
        positions = self._positions  # sampled before the offsets are read (see stream_watch)
        if not positions:
            return
        try:
            offsets = {(t, p): marks for t in self._kinds for p, marks in end_offsets(self.kafka, t).items()}
        except Exception as exc:  # KafkaUnavailable, KafkaException: the feed reports the broker too
            self.watch.probe_failed(f"{type(exc).__name__}: {exc}")
            return
        gaps = self.watch.observe(positions, offsets)
        for gap in gaps:
            if (gap.topic, gap.partition, gap.position) not in self._warned:
                log.warning("%s", describe_gap(gap, self.config.on_offset_gap))
        self._warned = {(g.topic, g.partition, g.position) for g in gaps}
        if self.config.on_offset_gap == "earliest" and gaps:
            with self._resets_lock:
                self._resets_wanted.update({TopicPartition(g.topic, g.partition): g for g in gaps})

    def _apply(self, value: bytes | None, kind: Kind, tp: TopicPartition, timestamp_ms: int | None) -> None:
        event, rejection = validate_event(value if value is not None else b"", kind)
        if rejection is None:
            rejection = self._refused_by_time(event, kind, tp, timestamp_ms)
        if rejection is not None:
            self.rejected[rejection.reason.value] += 1
            return
        if kind is Kind.TRANSACTION:
            payment = payment_from_event(event)
            self.features.observe_payment(payment)
            self._watermarks[tp] = max(self._watermarks.get(tp, payment.ts_us), payment.ts_us)
        else:
            self.features.observe_label(event["transaction_id"], event["is_fraud"], micros(event["reported_at"]))
        self.consumed[tp.topic] += 1

    def _refused_by_time(self, event: dict[str, Any], kind: Kind, tp: TopicPartition,
                         timestamp_ms: int | None) -> Rejection | None:
        """Ingest's timing rejection of a valid record, or None (no rules: none)."""
        if self.time_rules is None:
            return None
        # The record's Kafka timestamp; the time now where the record has none (ingest: the run's start).
        now_us = timestamp_ms * 1000 if timestamp_ms is not None and timestamp_ms >= 0 else int(time.time() * 1e6)
        if kind is Kind.TRANSACTION:
            return self.time_rules.check(micros(event["event_time"]), self._watermarks.get(tp), now_us)
        return self.time_rules.check_future(micros(event[TIME_FIELD_BY_KIND[kind]]), now_us, TIME_FIELD_BY_KIND[kind])

    def watch_report(self) -> WatchReport:
        """The watch's judgements that still hold for the live positions."""
        return self.watch.report(self._positions)

    def degraded(self, report: WatchReport) -> list[str]:
        """/health's reasons: the topics unreadable (the last probe failed), each position out of range
        (ingest's words, then the policy's action) and each stalled one."""
        unreadable = ([f"event feed: cannot read the topics ({report.error}); the online features miss every "
                       f"payment and fraud report sent since, until Kafka answers (retried every "
                       f"{self.config.watch_interval_s:g} s; what it holds is read then)"] if report.error else [])
        return (unreadable + [describe_gap(g, self.config.on_offset_gap) for g in report.gaps]
                + [s.reason() for s in report.stalls])

    def status(self) -> dict[str, Any]:
        report = self.watch_report()
        return {"seeded": self.seeded.is_set(),
                "seed": None if self.seed is None else {"payments": self.seed.payments, "labels": self.seed.labels,
                                                         "since": str(self.seed.since) if self.seed.since else None},
                "consumed": dict(self.consumed), "rejected": dict(self.rejected),
                "positions": dict(sorted(self.positions.items())), "last_error": self.last_error,
                "consuming": self.config.consume and self._thread.is_alive(),
                "degraded": self.degraded(report), "on_offset_gap": self.config.on_offset_gap,
                "offsets": {partition_name(k): {"position": pos, "earliest": low, "end": high,
                                                "lag": max(0, high - pos)}
                            for k, (pos, low, high) in sorted(report.offsets.items())},
                "out_of_range": [asdict(g) for g in report.gaps],
                "stalled": [{**asdict(s), "lag": s.lag} for s in report.stalls],
                "resets": [asdict(r) for r in report.resets],
                "checked_at": report.checked_at, "check_error": report.error}
