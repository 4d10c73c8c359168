"""The service's online features: :class:`pipeline.features.online.OnlineFeatureState` made shareable.

One state, written by three parties (the raw-store seed, the Kafka feed, scored requests) and read
by every request; :class:`FeatureStore` serialises them with a lock (the state is single-writer).
A scored payment joins its card's and merchant's history at once, so a burst of payments on one
card sees its own earlier payments even before they come back from the transactions topic; the
copy that arrives later is a no-op (the state ignores a transaction id it already holds).

Features are as of the payment's own event time with the training label delay (the state's
:class:`FeatureParams` come from ``ingest.toml``'s ``[features]``, the slice the Spark job uses).
Scored payments are remembered first, then their features computed together: a payment's windows
end strictly before its own instant, so each one sees exactly the batch's earlier payments, as if
the batch had been scored one by one in event-time order.

A service partition (:class:`.partitioning.Ownership`) keeps card windows for its own cards only;
every payment, whichever card, still joins its merchant's windows and the payment index fraud
reports are matched against, so merchant features are those of the whole stream.

Expiry runs against the latest event time seen, less a margin, so that payments arriving that late
still find every earlier payment their windows read: the service's config refuses a margin below the
lateness its time rules accept (:func:`.config.expiry_margin_floor_hours`). It takes the lock for
slices of at most ``EXPIRE_SLICE`` keys, so a request never waits for more than one slice.

Scored payments are first judged by ingest's timing rules (:class:`PaymentTimeRules`): one that
ingest would quarantine as ``late_event`` or ``future_event_time`` raises
:class:`.errors.PaymentRefused` (422) before anything of its batch is remembered, so a payment
dated 1970 or 9999 can neither enter the windows nor drag the stream's clock, and with it expiry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline.contract import TIME_FIELD_BY_KIND, Kind, Rejection, RejectReason, parse_rfc3339
from pipeline.features.kernel import US_PER_DAY, US_PER_SECOND
from pipeline.features.online import OnlineFeatureState, Payment
from pipeline.features.params import FeatureParams
from pipeline.ingest.config import RawStoreConfig
from pipeline.serving.config import FutureReference, LateReference, TimeRulesConfig
from pipeline.serving.errors import PaymentRefused
from pipeline.serving.partitioning import Ownership, unpartitioned
from pipeline.serving.recent_traffic import RecentTraffic

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
US = timedelta(microseconds=1)
EXPIRE_SLICE = 1000  # keys (cards, merchants, payments) expired per hold of the lock: about a millisecond
EXPIRE_PAUSE_S = 0.001  # between slices: requests waiting for the lock get it
# After seeding, the recent traffic gets the latest day's payments (a version's review threshold starts
# at the budget of the traffic it is about to decide), or the expiry margin's if that is shorter.
RECENT_SPAN_US = US_PER_DAY


def micros(rfc3339: str) -> int:
    """Epoch microseconds of a contract timestamp, exactly (integer arithmetic, no float rounding)."""
    return (parse_rfc3339(rfc3339) - EPOCH) // US


def warmup_rows(params: FeatureParams, n: int) -> list[dict[str, float | int]]:
    """Feature rows of ``n`` made-up payments (a few cards and merchants over a day), computed by the
    real kernel: realistic inputs for warming up a freshly loaded model."""
    state = OnlineFeatureState(params)
    start = micros("2026-01-05T00:00:00Z")
    rows = []
    for i in range(n):
        payment = Payment(f"warmup-{i}", f"card-{i % 7}", f"merchant-{i % 5}", start + i * 1_350_000_000,
                          float(5 + (i * 37) % 400), ("5411", "5812", None)[i % 3],
                          ("ecommerce", "card_present", None)[i % 3], ("DE", "FR", "US", None)[i % 4])
        rows.append(state.features(payment))
        state.observe_payment(payment)
    return rows


def payment_from_event(event: dict[str, Any]) -> Payment:
    """The fields of a valid transaction event (``contract.validate_event``) that features read."""
    return Payment(transaction_id=event["transaction_id"], card_id=event["card_id"],
                   merchant_id=event["merchant_id"], ts_us=micros(event["event_time"]),
                   amount=float(event["amount"]), mcc=event.get("mcc"), channel=event.get("channel"),
                   country=event.get("country"))


@dataclass(frozen=True)
class PaymentTimeRules:
    """Ingest's ``late_event`` and ``future_event_time`` (:mod:`pipeline.ingest.timing`) for one
    payment at a time, with the service's wall clock standing in for the record's Kafka timestamp
    and the latest payment event time the features have seen for the partition's watermark.
    ``late_against`` / ``future_against`` as in :class:`.config.TimeRulesConfig`."""

    max_lateness_days: float
    max_clock_skew_s: float
    late_against: LateReference = "watermark"
    future_against: FutureReference = "clock"

    def check(self, ts_us: int, watermark_us: int | None, now_us: int) -> Rejection | None:
        """Why a payment at ``ts_us`` is refused (ingest's order: future first), or None."""
        name = TIME_FIELD_BY_KIND[Kind.TRANSACTION]
        future = self.check_future(ts_us, now_us, name) if self.future_against == "clock" else None
        if future is not None:
            return future
        reference = {"clock": now_us, "watermark": watermark_us}.get(self.late_against)
        if reference is not None and ts_us < reference - int(self.max_lateness_days * US_PER_DAY):
            behind = ("the service's clock" if self.late_against == "clock"
                      else f"the latest {name} the service has seen (its watermark)")
            return Rejection(RejectReason.LATE_EVENT, name,
                             f"{name} is more than {self.max_lateness_days:g} days behind {behind}")
        return None


    def check_future(self, ts_us: int, now_us: int, name: str) -> Rejection | None:
        """``future_event_time`` for an event whose ``name`` field is at ``ts_us``, judged at ``now_us``."""
        if ts_us - now_us > int(self.max_clock_skew_s * US_PER_SECOND):
            return Rejection(RejectReason.FUTURE_EVENT_TIME, name,
                             f"{name} is more than {self.max_clock_skew_s:g} s ahead of the service's clock "
                             "(or the record's Kafka timestamp)")
        return None


def payment_time_rules(config: TimeRulesConfig, raw: RawStoreConfig) -> PaymentTimeRules:
    """The rules of ``serving.toml``'s ``[time_rules]`` with ingest.toml's ``[raw]`` bounds."""
    return PaymentTimeRules(raw.max_lateness_days, raw.max_clock_skew_s, config.late_against, config.future_against)


class FeatureStore:
    """Thread-safe online features with stream-time expiry. ``time_rules`` (None: none) judge
    scored payments against ``wall_clock`` (epoch seconds) and the latest event time seen.
    ``ownership`` (None: every card) says which cards' windows this store keeps."""

    def __init__(self, params: FeatureParams, expiry_margin_hours: float, time_rules: PaymentTimeRules | None = None,
                 wall_clock: Callable[[], float] = time.time, ownership: Ownership | None = None,
                 recent: RecentTraffic | None = None) -> None:
        self.params = params
        self.recent = recent  # the features of the latest scored payments (None: not kept)
        self.time_rules = time_rules
        self.ownership = ownership or unpartitioned()
        self._wall_clock = wall_clock
        self._state = OnlineFeatureState(params)
        self._lock = threading.Lock()
        self.expiry_margin_hours = expiry_margin_hours  # history is kept this far behind the latest payment
        self._margin_us = int(expiry_margin_hours * 3600 * 1_000_000)
        self._latest_us: int | None = None  # latest payment event time seen (the stream's clock)
        self.payments_seen = 0
        self.labels_seen = 0
        self.expiries = 0

    def score_features(self, payment: Payment) -> dict[str, float | int]:
        """Remember ``payment`` and return its features as of its time (one critical section)."""
        return self.score_features_many((payment,))[0]

    def score_features_many(self, payments: Sequence[Payment]) -> list[dict[str, float | int]]:
        """Remember ``payments``, then return the features of each as of its own time (one critical
        section). Each sees the state's and the batch's strictly earlier payments, never itself: the
        same rows as scoring them one by one in event-time order. Raises PaymentRefused for the first
        payment the time rules refuse, judged in order as ingest would, before any is remembered."""
        with self._lock:
            self._screen(payments)
            for payment in payments:
                self._observe(payment)
            rows = self._state.features_many(payments)
        if self.recent is not None:
            self.recent.add(rows)
        return rows

    def recent_since_us(self) -> int | None:
        """The earliest event time of the payments the seed puts into the recent traffic: the latest less a
        day (``RECENT_SPAN_US``) or less the expiry margin if that is shorter, so that the state still
        computes their features whole; None when no recent traffic is kept or nothing was seen."""
        with self._lock:
            if self.recent is None or self._latest_us is None:
                return None
            return self._latest_us - min(self._margin_us, RECENT_SPAN_US)

    def remember_recent(self, payments: Sequence[Payment]) -> int:
        """Put the features of already observed ``payments`` (the raw store's, after seeding) into the
        recent traffic: those of this partition's cards since :meth:`recent_since_us` (the latest day,
        whose windows the state holds whole), the latest ``recent.capacity`` of them. The number of rows
        added."""
        since = self.recent_since_us()
        if since is None:
            return 0
        with self._lock:
            kept = sorted((p for p in payments if p.ts_us >= since and self.ownership.owns(p.card_id)),
                          key=lambda p: p.ts_us)[-self.recent.capacity:]
            rows = self._state.features_many(kept)
        self.recent.add(rows)
        return len(rows)

    def check_many(self, payments: Sequence[Payment]) -> None:
        """Raise PaymentRefused as :meth:`score_features_many` would now, remembering nothing (the
        router's check pass before a batch split across partitions is scored)."""
        with self._lock:
            self._screen(payments)

    def _screen(self, payments: Sequence[Payment]) -> None:
        if self.time_rules is None:
            return
        now_us = int(self._wall_clock() * US_PER_SECOND)
        watermark = self._latest_us
        for i, payment in enumerate(payments):
            rejection = self.time_rules.check(payment.ts_us, watermark, now_us)
            if rejection is not None:
                raise PaymentRefused(rejection, i)
            watermark = payment.ts_us if watermark is None else max(watermark, payment.ts_us)

    def features(self, payment: Payment) -> dict[str, float | int]:
        """Features of ``payment`` as of its time, without remembering it."""
        with self._lock:
            return self._state.features(payment)

    def observe_payment(self, payment: Payment) -> None:
        with self._lock:
            self._observe(payment)

    def _observe(self, payment: Payment) -> None:
        self._state.observe_payment(payment, with_card=self.ownership.owns(payment.card_id))
        self.payments_seen += 1
        if self._latest_us is None or payment.ts_us > self._latest_us:
            self._latest_us = payment.ts_us

    def observe_label(self, transaction_id: str, is_fraud: bool, reported_us: int) -> None:
        with self._lock:
            self._state.observe_label(transaction_id, is_fraud, reported_us)
            self.labels_seen += 1

    def expire(self) -> None:
        """Drop what no payment later than ``latest seen - margin`` can read, a slice at a time."""
        while True:
            with self._lock:
                if self._latest_us is None:
                    return
                done = self._state.expire(self._latest_us - self._margin_us, EXPIRE_SLICE)
            if done:
                break
            time.sleep(EXPIRE_PAUSE_S)
        self.expiries += 1

    def status(self) -> dict[str, Any]:
        with self._lock:
            size = self._state.size()
            latest = self._latest_us
        return {**size, "payments_seen": self.payments_seen, "labels_seen": self.labels_seen,
                "expiries": self.expiries,
                "latest_event_time": None if latest is None else (EPOCH + latest * US).isoformat()}
