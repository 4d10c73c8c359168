"""Pure: a day's first decisions from the scores topic, labelled with the fraud reports matured by a cutoff.

Score events (every record of the topic, as read) end in exactly one bucket, so
``read = used + other_dates + unparseable + duplicates + no_thresholds`` holds (checked):

* ``unparseable``: no value, not JSON, not a score event, or a field of the wrong type;
* ``other_dates``: a payment whose event date (UTC, as the raw store partitions it) is not the day;
* ``duplicates``: a later decision on a payment already decided (a retried request, a resend):
  the first decision, by the service's ``scored_at``, is the one that acted;
* ``no_thresholds``: the payment's first decision carries no operating points (events written
  before they existed): it cannot be judged at the thresholds it was decided at;
* ``used``: the rest, one per payment.

``out_of_order`` annotates (it is not a bucket): events of the day whose ``scored_at`` is earlier
than an event before them in the same partition. Choosing the first decision by ``scored_at``, not
by offset, makes them harmless; counting them says the topic's order cannot be trusted.

Fraud reports follow the dataset builder's rule (``features.transforms.labels_as_of``): the latest
report made before the cutoff decides the label (1 fraud, 0 cleared; a fraud report wins a tie),
and a monitored payment without one is genuine. Each report read is one of ``used``,
``superseded`` (an earlier report of a monitored payment), ``after_cutoff``, ``other_dates``,
``without_thresholds`` (its payment's decision was left out above) or ``never_scored`` (no decision
on the topic for its transaction: an unknown transaction, a payment the service never scored, or
one decided before the topic's retention began).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import Protocol

import numpy as np

from pipeline.contract import parse_rfc3339
from pipeline.serving.features import micros
from pipeline.serving.score_event import ScoreEvent

MAX_EXAMPLES = 5  # per reason, in the report


class TopicRecord(Protocol):
    """What the join reads of a Kafka record (:class:`pipeline.kafka.reader.ConsumedRecord`)."""

    partition: int
    offset: int
    value: bytes | None


def event_date(rfc3339: str) -> date:
    """The payment's date: its event time's UTC date (the raw store's ``event_date`` partition)."""
    return parse_rfc3339(rfc3339).date()


@dataclass(frozen=True)
class ScoredPayment:
    """The first decision on one payment of the day, with the thresholds it was decided at."""

    transaction_id: str
    model_version: int
    score: float
    review_threshold: float
    block_threshold: float
    scored_at_us: int
    features: dict[str, float | int]


@dataclass(frozen=True)
class ScoreAccounting:
    read: int
    used: int
    other_dates: int
    unparseable: int
    duplicates: int
    no_thresholds: int
    out_of_order: int  # annotation: inside used and duplicates
    examples: dict[str, list[str]] = field(default_factory=dict)  # reason -> first few records

    def __post_init__(self) -> None:
        buckets = self.used + self.other_dates + self.unparseable + self.duplicates + self.no_thresholds
        if buckets != self.read:
            raise AssertionError(f"score events: read {self.read} != used + other_dates + unparseable + "
                                 f"duplicates + no_thresholds = {buckets}")


@dataclass(frozen=True)
class DayDecisions:
    day: date
    payments: tuple[ScoredPayment, ...]  # one per payment of the day, in order of transaction id
    accounting: ScoreAccounting
    without_thresholds: frozenset[str]  # payments of the day whose first decision had no thresholds
    other_dates: frozenset[str]  # transactions decided with an event date other than the day


def parse_score_event(value: bytes | None) -> ScoreEvent:
    """A score event, its types checked; ValueError saying what is wrong otherwise."""
    if not value:
        raise ValueError("empty record value")
    try:
        event = ScoreEvent.from_json(value)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"not a score event ({type(exc).__name__}: {exc})") from exc
    if not isinstance(event.transaction_id, str) or not event.transaction_id:
        raise ValueError("transaction_id is not a non-empty string")
    if not isinstance(event.model_version, int) or isinstance(event.model_version, bool):
        raise ValueError(f"model_version is not an integer: {event.model_version!r}")
    if not _probability(event.score):
        raise ValueError(f"score is not a probability: {event.score!r}")
    for name in ("review_threshold", "block_threshold"):
        threshold = getattr(event, name)
        if threshold is not None and not _probability(threshold):
            raise ValueError(f"{name} is not a probability: {threshold!r}")
    if not isinstance(event.features, dict):
        raise ValueError("features is not an object")
    micros(event.event_time)  # ValueError when not RFC 3339
    micros(event.scored_at)
    return event


def _probability(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0.0 <= x <= 1.0


def first_decisions(records: Iterable[TopicRecord], day: date) -> DayDecisions:
    """The first decision per payment of ``day`` among ``records`` (a whole topic), and the accounting."""
    counts = defaultdict(int)
    examples: dict[str, list[str]] = defaultdict(list)
    candidates: dict[str, list[tuple[int, int, int, ScoreEvent]]] = defaultdict(list)
    latest_in_partition: dict[int, int] = {}
    other_ids: set[str] = set()

    def note(reason: str, text: str) -> None:
        counts[reason] += 1
        if len(examples[reason]) < MAX_EXAMPLES:
            examples[reason].append(text)

    read = 0
    for record in records:
        read += 1
        where = f"partition {record.partition} offset {record.offset}"
        try:
            event = parse_score_event(record.value)
        except ValueError as exc:
            note("unparseable", f"{where}: {exc}"[:300])
            continue
        scored_at = micros(event.scored_at)
        previous = latest_in_partition.get(record.partition)
        latest_in_partition[record.partition] = scored_at if previous is None else max(previous, scored_at)
        if event_date(event.event_time) != day:
            counts["other_dates"] += 1
            other_ids.add(event.transaction_id)
            continue
        if previous is not None and scored_at < previous:
            note("out_of_order", f"{where}: {event.transaction_id} scored at {event.scored_at}")
        candidates[event.transaction_id].append((scored_at, record.partition, record.offset, event))

    payments, without = [], set()
    for tid in sorted(candidates):
        decisions = sorted(candidates[tid], key=lambda c: c[:3])
        for _, partition, offset, _ in decisions[1:]:
            note("duplicates", f"partition {partition} offset {offset}: {tid} decided again")
        scored_at, _, _, first = decisions[0]
        if first.review_threshold is None or first.block_threshold is None:
            counts["no_thresholds"] += 1
            without.add(tid)
            continue
        payments.append(ScoredPayment(tid, first.model_version, float(first.score), float(first.review_threshold),
                                      float(first.block_threshold), scored_at, first.features))
    accounting = ScoreAccounting(read=read, used=len(payments), other_dates=counts["other_dates"],
                                 unparseable=counts["unparseable"], duplicates=counts["duplicates"],
                                 no_thresholds=counts["no_thresholds"], out_of_order=counts["out_of_order"],
                                 examples=dict(examples))
    return DayDecisions(day, tuple(payments), accounting, frozenset(without), frozenset(other_ids - set(candidates)))


# ---- fraud reports --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """One row of the raw store's labels table."""

    transaction_id: str
    is_fraud: bool
    reported_at_us: int


@dataclass(frozen=True)
class ReportAccounting:
    read: int
    used: int
    superseded: int
    after_cutoff: int
    other_dates: int
    without_thresholds: int
    never_scored: int

    def __post_init__(self) -> None:
        buckets = (self.used + self.superseded + self.after_cutoff + self.other_dates + self.without_thresholds
                   + self.never_scored)
        if buckets != self.read:
            raise AssertionError(f"reports: read {self.read} != the sum of the buckets {buckets}")


def label_payments(decisions: DayDecisions, reports: Iterable[Report], cutoff_us: int) -> tuple[np.ndarray, ReportAccounting]:
    """Labels aligned with ``decisions.payments`` (1 fraud, 0 genuine) and the reports' accounting."""
    monitored = {p.transaction_id for p in decisions.payments}
    counts = defaultdict(int)
    deciding: dict[str, tuple[int, bool]] = {}
    read = 0
    for report in reports:
        read += 1
        tid = report.transaction_id
        if report.reported_at_us >= cutoff_us:
            counts["after_cutoff"] += 1
        elif tid in monitored:
            key = (report.reported_at_us, bool(report.is_fraud))  # a fraud report wins a tie
            if tid in deciding:
                counts["superseded"] += 1
                deciding[tid] = max(deciding[tid], key)
            else:
                deciding[tid] = key
        elif tid in decisions.without_thresholds:
            counts["without_thresholds"] += 1
        elif tid in decisions.other_dates:
            counts["other_dates"] += 1
        else:
            counts["never_scored"] += 1
    labels = np.array([int(deciding.get(p.transaction_id, (0, False))[1]) for p in decisions.payments], dtype=np.int64)
    accounting = ReportAccounting(read=read, used=len(deciding), superseded=counts["superseded"],
                                  after_cutoff=counts["after_cutoff"], other_dates=counts["other_dates"],
                                  without_thresholds=counts["without_thresholds"], never_scored=counts["never_scored"])
    return labels, accounting


# ---- the raw store's payments of the day ----------------------------------------------------------


@dataclass(frozen=True)
class PaymentAccounting:
    """Annotations comparing the topic with the raw store's payments of the day (event date)."""

    raw_store: int  # payments of the day the raw store holds
    decided: int  # of those, with a decision on the topic (used or without thresholds)
    missing_decisions: int  # raw-store payments of the day no decision on the topic covers
    not_in_raw_store: int  # decided payments of the day the raw store does not hold


def payment_accounting(decisions: DayDecisions, raw_ids: Iterable[str]) -> PaymentAccounting:
    raw = set(raw_ids)
    decided = {p.transaction_id for p in decisions.payments} | decisions.without_thresholds
    return PaymentAccounting(raw_store=len(raw), decided=len(raw & decided), missing_decisions=len(raw - decided),
                             not_in_raw_store=len(decided - raw))
