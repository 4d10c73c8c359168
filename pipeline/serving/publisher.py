"""Every decision to the scores topic, off the request path; the shadow model scores here too.

A request only appends its :class:`ScoreEvent` to a bounded queue (never blocks: when the queue is
full the event is dropped and counted, so a slow or absent broker cannot slow scoring down). One
background thread drains the queue in batches every few milliseconds; it is not woken per decision
(a wake-up per request would hand the GIL back and forth on every request). After a quarter second
with nothing to publish it parks on an event instead of polling: an idle service then costs no
wake-ups, and the first decision after a quiet spell wakes it once. It parks only once every
published decision has its delivery report (the loop is what serves them). When a challenger is
loaded in shadow mode it scores the batch's features in one forward and decides them at its own
version's thresholds (its opinion is added to the event, and counted when it would have decided
differently; it never decides), then hands the events to a producer with the project's settings
(:func:`pipeline.kafka.producer.producer_settings`: ``acks=all``, idempotent, batched). Delivery failures are counted with their last error.

The producer is confluent-kafka's (librdkafka batches and sends in C): it shares the process, and
so the CPU, with scoring, and kafka-python's pure-Python producer cost 72 us of CPU per decision
against 2 us (measured here, ~1.5 kB events) in a request budget of well under a millisecond.
The feed consumes with kafka-python, as the design names.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipeline.kafka.admin import create_topics
from pipeline.kafka.producer import producer_settings
from pipeline.kafka.settings import KafkaConfig, with_log_routing
from pipeline.serving.config import DecisionConfig, ScoresConfig
from pipeline.serving.decision import decide
from pipeline.serving.reloader import LiveVersion
from pipeline.serving.rules import RuleHit
from pipeline.serving.score_event import ScoreEvent, ShadowScore

log = logging.getLogger(__name__)

BATCH = 256  # events taken off the queue at once (one shadow forward, one producer wake-up)
DRAIN_INTERVAL_S = 0.005  # an empty queue is looked at again after this: decisions wait at most ~5 ms
PARK_AFTER_S = 0.25  # this long with an empty queue, and the thread sleeps until a decision wakes it
RETRY_S = 2.0  # between attempts to create the producer
DELIVERY_TIMEOUT_S = 30.0  # a decision not acknowledged by then counts as failed
FLUSH_ON_STOP_S = 5.0  # a stopping service waits this long for the last acknowledgements


class ScorePublisher:
    """Queue -> (shadow score) -> scores topic. ``kafka=None`` or ``publish=false``: shadow only."""

    def __init__(self, config: ScoresConfig, kafka: KafkaConfig | None, decision: DecisionConfig,
                 shadow: Callable[[], LiveVersion | None]) -> None:
        self.config = config
        self.kafka = kafka if config.publish else None
        self.decision = decision
        self._shadow = shadow
        self._queue: deque[tuple[ScoreEvent, tuple[RuleHit, ...]]] = deque()  # appends/pops are atomic
        self._thread = threading.Thread(target=self._run, name="score-publisher", daemon=True)
        self._stopping = threading.Event()
        self._wake = threading.Event()  # set by the first decision submitted while the thread is parked
        self._parked = False
        self._idle_polls = 0
        self._lock = threading.Lock()  # counters are bumped by requests and by this thread
        self.counts = {"queued": 0, "dropped": 0, "published": 0, "failed": 0, "shadow_scored": 0,
                       "shadow_disagreed": 0}
        self.last_error: str | None = None

    def start(self) -> None:
        if self.kafka is not None and self.config.create_topic:
            try:
                create_topics(self.kafka, (self.config.topic,), self.kafka.partitions)
            except Exception as exc:  # reported; the producer retries and the topic may appear later
                self.last_error = f"cannot create topic {self.config.topic!r}: {exc}"
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Publish what is queued (up to ``timeout_s``), then close the producer."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, event: ScoreEvent, hits: tuple[RuleHit, ...]) -> None:
        if len(self._queue) >= self.config.queue_size:
            self._count("dropped")
            return
        self._queue.append((event, hits))
        self._count("queued")
        if self._parked:  # read after the append: a parking thread either sees the event or gets woken
            self._wake.set()

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def _run(self) -> None:
        producer = None
        while True:
            if self.kafka is not None and producer is None:
                if self._stopping.is_set():
                    break  # never connected: what is queued cannot be published
                producer = self._connect()
                if producer is None:
                    self._stopping.wait(RETRY_S)
                    continue
            batch = self._take_batch(in_flight=len(producer) if producer is not None else 0)
            if producer is not None:
                producer.poll(0)  # delivery reports of earlier batches
            if batch is None:
                break
            events = self._with_shadow(batch)
            if producer is not None:
                for event in events:
                    self._send(producer, event)
        if producer is not None:
            undelivered = producer.flush(FLUSH_ON_STOP_S)
            if undelivered:
                self._count("failed", undelivered)

    def _take_batch(self, in_flight: int) -> list[tuple[ScoreEvent, tuple[RuleHit, ...]]] | None:
        """Up to BATCH queued events (none after DRAIN_INTERVAL_S idle); ``None`` once stopping and drained.
        Never parks while ``in_flight`` decisions await their delivery reports (only this loop polls them)."""
        if not self._queue:
            if self._stopping.is_set():
                return None
            if in_flight == 0 and self._idle_polls * DRAIN_INTERVAL_S >= PARK_AFTER_S:
                self._park()
            else:
                self._idle_polls += 1
                self._stopping.wait(DRAIN_INTERVAL_S)
        else:
            self._idle_polls = 0
        batch = []
        while self._queue and len(batch) < BATCH:
            batch.append(self._queue.popleft())
        return batch

    def _park(self) -> None:
        """Sleep until :meth:`submit` or :meth:`stop` sets the wake event (the flag goes up before the look)."""
        self._wake.clear()
        self._parked = True
        try:
            if not self._queue and not self._stopping.is_set():
                self._wake.wait()
        finally:
            self._parked = False
            self._idle_polls = 0

    def _connect(self) -> Producer | None:
        try:
            return Producer(with_log_routing(producer_settings(self.kafka, DELIVERY_TIMEOUT_S)))
        except KafkaException as exc:  # bad settings; an unreachable cluster only shows in delivery reports
            self.last_error = f"cannot create a producer for {self.kafka.bootstrap_servers}: {exc}"
            return None

    def _with_shadow(self, items: list[tuple[ScoreEvent, tuple[RuleHit, ...]]]) -> list[ScoreEvent]:
        shadow = self._shadow()
        if shadow is None or not items:
            return [event for event, _ in items]
        try:
            scores = shadow.scorer.score_rows([event.features for event, _ in items])
        except Exception as exc:  # a broken challenger must not cost the champion's events
            self.last_error = f"shadow version {shadow.version} failed to score: {exc}"
            return [event for event, _ in items]
        out = []
        thresholds = shadow.deciding()  # the challenger holds its own budget on its own scores, as if live
        for (event, hits), score in zip(items, scores, strict=True):
            decision = decide(score, hits, thresholds, self.decision.allowlist_override).decision.value
            out.append(dataclasses.replace(event, shadow=ShadowScore(shadow.version, score, decision)))
            if decision != event.decision:
                self._count("shadow_disagreed")
                log.debug("shadow v%d would decide %s (%.4f) for %s; champion v%d decided %s (%.4f)",
                          shadow.version, decision, score, event.transaction_id, event.model_version,
                          event.decision, event.score)
        shadow.observe(scores)
        self._count("shadow_scored", len(items))
        return out

    def _send(self, producer: Producer, event: ScoreEvent) -> None:
        def delivered(err: KafkaError | None, _: Message) -> None:
            if err is None:
                self._count("published")
            else:
                self._count("failed")
                self.last_error = f"delivery to {self.config.topic!r} failed: {err.str()}"

        while True:
            try:
                producer.produce(self.config.topic, key=event.transaction_id.encode("utf-8"), value=event.to_json(),
                                 on_delivery=delivered)
                return
            except BufferError:  # librdkafka's queue is full: serve delivery reports, then retry
                producer.poll(0.05)
            except KafkaException as exc:
                self._count("failed")
                self.last_error = f"cannot queue a decision for {self.config.topic!r}: {exc}"
                return

    def lost(self) -> str | None:
        """/health's warning when decisions never reached the scores topic (the monitor cannot judge
        them), else None. Counted since the service started: a lost decision stays lost."""
        with self._lock:
            failed, dropped = self.counts["failed"], self.counts["dropped"]
        if self.kafka is None or not (failed or dropped):
            return None
        return (f"scores topic {self.config.topic!r}: {failed} decision(s) failed delivery and {dropped} were dropped "
                f"from a full queue since the service started (last error: {self.last_error}); the monitor does "
                f"not see them. Check the broker (`fraudctl broker status`)")

    def status(self) -> dict[str, Any]:
        with self._lock:
            counts = dict(self.counts)
        return {**counts, "pending": len(self._queue), "topic": self.config.topic if self.kafka else None,
                "last_error": self.last_error}
