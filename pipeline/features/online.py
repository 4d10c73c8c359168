"""Online features: the kernel applied to one card's and one merchant's in-memory history.

The scoring service keeps an :class:`OnlineFeatureState`, feeds it every payment and fraud report
it sees (from Kafka, or seeded from the raw store), and asks it for the features of a new payment.
The numbers are those the Spark dataset holds for the same payment (tested to be identical): same
kernel, same integer arithmetic, same label rule (a fraud report feeds its merchant's rate
``label_delay`` after ``reported_at``, first report only, if the payment happened at most
``label_match_days`` before the report).

Many payments can be asked at once (:meth:`OnlineFeatureState.features_many`): one kernel call
over their cards' and merchants' histories, the same numbers as one call per payment.

Memory is bounded by expiry (:meth:`OnlineFeatureState.expire`): payments older than the longest
window, fraud instants older than the longest merchant window, the payment index that reports
are matched against after ``label_match_days``, and fraud reports whose payment never came once
their instant could no longer be read by any window. Expiry is incremental: every key is filed under the
hours of the events it holds (:class:`_ExpiryIndex`), so a call visits only keys that hold
something old, at most ``budget`` of them, and never walks the whole state.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from pipeline.features import definitions as fd
from pipeline.features.kernel import (
    US_PER_DAY,
    CardEvents,
    KeyedTimes,
    card_features,
    merchant_features,
    time_features,
)
from pipeline.features.params import FeatureParams


@dataclass(frozen=True)
class Payment:
    """The fields of a transaction event the features read."""

    transaction_id: str
    card_id: str
    merchant_id: str
    ts_us: int
    amount: float
    mcc: str | None = None
    channel: str | None = None
    country: str | None = None


@dataclass
class _CardHistory:
    ts: list[int] = field(default_factory=list)
    amount: list[float] = field(default_factory=list)
    merchant: list[int] = field(default_factory=list)
    country: list[int] = field(default_factory=list)

    def insert(self, ts: int, amount: float, merchant: int, country: int) -> None:
        i = bisect.bisect_right(self.ts, ts)  # arrival order does not matter: kept sorted by time
        self.ts.insert(i, ts)
        self.amount.insert(i, amount)
        self.merchant.insert(i, merchant)
        self.country.insert(i, country)

    def drop_before(self, ts: int) -> int:
        """Drop the events before ``ts``; returns how many."""
        i = bisect.bisect_left(self.ts, ts)
        del self.ts[:i], self.amount[:i], self.merchant[:i], self.country[:i]
        return i


@dataclass
class _MerchantHistory:
    payments: list[int] = field(default_factory=list)
    fraud_known: list[int] = field(default_factory=list)


_NO_CARD = _CardHistory()
_NO_MERCHANT = _MerchantHistory()

EXPIRY_BUCKET_US = 3600 * 1_000_000  # expiry files keys by the hour of their events


class _ExpiryIndex:
    """Keys filed by the hour of each event they hold: which keys may hold events older than a horizon.

    A key is filed once per hour it has events in. :meth:`take_due` hands out keys of the hours that
    end at or before the horizon, oldest hour first, so the caller visits only keys that hold
    something to drop (an event in the hour of the horizon itself waits for that hour to pass).
    """

    def __init__(self) -> None:
        self._buckets: dict[int, set[Hashable]] = {}
        self._hours: list[int] = []  # heap of the bucket numbers in _buckets

    def add(self, ts_us: int, key: Hashable) -> None:
        hour = ts_us // EXPIRY_BUCKET_US
        keys = self._buckets.get(hour)
        if keys is None:
            keys = self._buckets[hour] = set()
            heapq.heappush(self._hours, hour)
        keys.add(key)

    def due(self, horizon_us: int) -> bool:
        return bool(self._hours) and (self._hours[0] + 1) * EXPIRY_BUCKET_US <= horizon_us

    def take_due(self, horizon_us: int, limit: int) -> list[Hashable]:
        """Up to ``limit`` keys filed under hours that end at or before ``horizon_us`` (removed from the index)."""
        out: list[Hashable] = []
        while len(out) < limit and self.due(horizon_us):
            hour = self._hours[0]
            keys = self._buckets[hour]
            while keys and len(out) < limit:
                out.append(keys.pop())
            if not keys:
                heapq.heappop(self._hours)
                del self._buckets[hour]
        return out


class _Interner(dict):
    """String -> small int, stable for the life of the state (the kernel only compares codes)."""

    def code(self, value: str | None) -> int:
        return self.setdefault(value, len(self))


class OnlineFeatureState:
    """Per-card and per-merchant histories with the kernel on top. Not thread-safe: one writer."""

    def __init__(self, params: FeatureParams) -> None:
        self.params = params
        self._cards: dict[str, _CardHistory] = {}
        self._merchants: dict[str, _MerchantHistory] = {}
        self._payments: dict[str, tuple[str, int]] = {}  # transaction_id -> (merchant_id, ts_us)
        self._first_fraud_report: dict[str, int] = {}  # transaction_id -> earliest fraud report (us)
        self._merchant_codes = _Interner()
        self._country_codes = _Interner()
        self._card_events = 0
        # What expiry visits: cards and merchants by the hours of their events, payments by their hour.
        self._expiring_cards = _ExpiryIndex()
        self._expiring_merchants = _ExpiryIndex()
        self._expiring_payments = _ExpiryIndex()
        self._expiring_orphan_reports = _ExpiryIndex()  # reports of payments not (yet) seen, by report time

    # -- what the stream feeds -------------------------------------------------------------------
    def observe_payment(self, p: Payment) -> None:
        """Add a payment to its card's and merchant's history (idempotent per transaction_id)."""
        if p.transaction_id in self._payments:
            return
        self._payments[p.transaction_id] = (p.merchant_id, p.ts_us)
        card = self._cards.setdefault(p.card_id, _CardHistory())
        card.insert(p.ts_us, p.amount, self._merchant_codes.code(p.merchant_id), self._country_codes.code(p.country))
        self._card_events += 1
        bisect.insort(self._merchants.setdefault(p.merchant_id, _MerchantHistory()).payments, p.ts_us)
        self._expiring_payments.add(p.ts_us, p.transaction_id)
        self._expiring_cards.add(p.ts_us, p.card_id)
        self._expiring_merchants.add(p.ts_us, p.merchant_id)
        reported = self._first_fraud_report.get(p.transaction_id)
        if reported is not None:  # the report arrived before its payment
            self._add_fraud_instant(p.transaction_id, reported, None)

    def observe_label(self, transaction_id: str, is_fraud: bool, reported_us: int) -> None:
        """A fraud report (``is_fraud``) makes its merchant's fraud instant ``reported + delay``;
        the earliest fraud report of a payment counts, clearing reports change nothing here."""
        if not is_fraud:
            return
        previous = self._first_fraud_report.get(transaction_id)
        if previous is not None and previous <= reported_us:
            return
        self._first_fraud_report[transaction_id] = reported_us
        if transaction_id in self._payments:
            self._add_fraud_instant(transaction_id, reported_us, previous)
        else:  # the payment may still arrive (out-of-order replay), or never (before the state's history)
            self._expiring_orphan_reports.add(reported_us, transaction_id)

    def _add_fraud_instant(self, transaction_id: str, reported_us: int, replaced_us: int | None) -> None:
        merchant_id, ts = self._payments[transaction_id]
        history = self._merchants[merchant_id]
        match_us = self.params.label_match_days * US_PER_DAY
        if replaced_us is not None and ts >= replaced_us - match_us:
            history.fraud_known.remove(replaced_us + self.params.label_delay_us)
        if ts >= reported_us - match_us:
            bisect.insort(history.fraud_known, reported_us + self.params.label_delay_us)
            self._expiring_merchants.add(reported_us + self.params.label_delay_us, merchant_id)

    # -- what scoring asks -----------------------------------------------------------------------
    def features(self, p: Payment) -> dict[str, float | int]:
        """Features of ``p`` as of its own time (earlier events only; ``p`` need not be observed)."""
        return self.features_many((p,))[0]

    def features_many(self, payments: Sequence[Payment]) -> list[dict[str, float | int]]:
        """Features of each payment as of its own time, in one kernel call over their cards' and
        merchants' histories: each row equals :meth:`features` of that payment alone (the kernel
        treats keys independently). Payments see each other only where they have been observed."""
        if not payments:
            return []
        card_keys = _dense_codes(p.card_id for p in payments)
        merchant_keys = _dense_codes(p.merchant_id for p in payments)
        cards = [self._cards.get(card_id, _NO_CARD) for card_id in card_keys]
        merchants = [self._merchants.get(merchant_id, _NO_MERCHANT) for merchant_id in merchant_keys]
        history = CardEvents(key=_keys_of([len(c.ts) for c in cards]), ts_us=_int64(c.ts for c in cards),
                             amount=np.array(list(chain.from_iterable(c.amount for c in cards)), dtype=np.float64),
                             merchant=_int64(c.merchant for c in cards), country=_int64(c.country for c in cards))
        ts = np.array([p.ts_us for p in payments], dtype=np.int64)
        query = CardEvents(key=np.array([card_keys[p.card_id] for p in payments], dtype=np.int64), ts_us=ts,
                           amount=np.array([p.amount for p in payments], dtype=np.float64),
                           merchant=np.array([self._merchant_codes.get(p.merchant_id, -1) for p in payments],
                                             dtype=np.int64),
                           country=np.array([self._country_codes.get(p.country, -1) for p in payments],
                                            dtype=np.int64))
        merchant_history = KeyedTimes(_keys_of([len(m.payments) for m in merchants]),
                                      _int64(m.payments for m in merchants))
        fraud_known = KeyedTimes(_keys_of([len(m.fraud_known) for m in merchants]),
                                 _int64(m.fraud_known for m in merchants))
        merchant_query = KeyedTimes(np.array([merchant_keys[p.merchant_id] for p in payments], dtype=np.int64), ts)
        columns = {name: np.asarray(values, dtype=np.float64).tolist() for name, values in
                   (card_features(history, _unseen_as_new(query)) | time_features(ts)
                    | merchant_features(merchant_history, fraud_known, merchant_query)).items()}
        columns["amount"] = [float(p.amount) for p in payments]
        for name, source in fd.CATEGORICAL_SOURCES.items():
            columns[name] = [_code(getattr(p, source), fd.CATEGORICAL_FEATURES[name]) for p in payments]
        rows = [dict(zip(fd.FEATURE_COLUMNS, values, strict=True))
                for values in zip(*(columns[name] for name in fd.FEATURE_COLUMNS), strict=True)]
        return rows

    # -- bounded memory --------------------------------------------------------------------------
    def expire(self, now_us: int, budget: int | None = None) -> bool:
        """Forget what no feature of a payment at or after ``now_us`` can read, visiting at most
        ``budget`` keys (cards, merchants, payments; ``None``: no limit). Returns ``True`` when
        nothing is left to expire for ``now_us``, ``False`` when the budget ran out first.

        Only keys filed under hours that ended before a horizon are visited, so the work is in
        proportion to what expires, not to the size of the state. Something in the horizon's own
        hour may stay until that hour has passed; no window reads it either way."""
        card_horizon = now_us - fd.LOOKBACK_DAYS * US_PER_DAY
        merchant_horizon = now_us - max(fd.MERCHANT_WINDOWS_DAYS) * US_PER_DAY
        # A report made after now can still match payments back to label_match_days before it.
        match_horizon = now_us - self.params.label_match_days * US_PER_DAY
        # A report older than this is worthless even if its payment turns up: the instant it would
        # add (reported + delay) is already before every merchant window of a payment from now on.
        report_horizon = min(match_horizon, merchant_horizon - self.params.label_delay_us)
        left = float("inf") if budget is None else budget
        for card_id in self._expiring_cards.take_due(card_horizon, left):
            history = self._cards.get(card_id)
            if history is not None:
                self._card_events -= history.drop_before(card_horizon)
                if not history.ts:
                    del self._cards[card_id]
            left -= 1
        for merchant_id in self._expiring_merchants.take_due(merchant_horizon, left):
            history = self._merchants.get(merchant_id)
            if history is not None:
                del history.payments[:bisect.bisect_left(history.payments, merchant_horizon)]
                del history.fraud_known[:bisect.bisect_left(history.fraud_known, merchant_horizon)]
                if not history.payments and not history.fraud_known:
                    del self._merchants[merchant_id]
            left -= 1
        for transaction_id in self._expiring_payments.take_due(match_horizon, left):
            held = self._payments.get(transaction_id)
            if held is not None and held[1] < match_horizon:
                del self._payments[transaction_id]
                self._first_fraud_report.pop(transaction_id, None)
            left -= 1
        for transaction_id in self._expiring_orphan_reports.take_due(report_horizon, left):
            reported = self._first_fraud_report.get(transaction_id)
            if transaction_id not in self._payments and reported is not None and reported < report_horizon:
                del self._first_fraud_report[transaction_id]
            left -= 1
        return not (self._expiring_cards.due(card_horizon) or self._expiring_merchants.due(merchant_horizon)
                    or self._expiring_payments.due(match_horizon) or self._expiring_orphan_reports.due(report_horizon))

    def size(self) -> dict[str, int]:
        """Entries held (for /metrics and the expiry test); constant time."""
        return {"cards": len(self._cards), "merchants": len(self._merchants), "payments": len(self._payments),
                "card_events": self._card_events, "fraud_reports": len(self._first_fraud_report)}


@functools.lru_cache(maxsize=65_536)
def _code(value: str | None, buckets: int) -> int:
    """:func:`definitions.categorical_code`, the definition the kernel's vectorised codes use, memoised."""
    return fd.categorical_code(value, buckets)


def _dense_codes(ids) -> dict[str, int]:
    """Each distinct id -> 0, 1, 2, ... in order of first appearance (the kernel's dense key codes)."""
    codes: dict[str, int] = {}
    for i in ids:
        codes.setdefault(i, len(codes))
    return codes


def _keys_of(lengths: list[int]) -> np.ndarray:
    """Key code of every event of histories laid end to end (history ``k`` has ``lengths[k]`` events)."""
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def _int64(lists) -> np.ndarray:
    """Sorted per-key lists laid end to end, as one int64 array (sorted by key, then time)."""
    return np.array(list(chain.from_iterable(lists)), dtype=np.int64)


def _unseen_as_new(query: CardEvents) -> CardEvents:
    """A merchant/country the state never saw has no earlier payment: give it a code no event has."""
    unseen = np.iinfo(np.int32).max
    return CardEvents(key=query.key, ts_us=query.ts_us, amount=query.amount,
                      merchant=np.where(query.merchant < 0, unseen, query.merchant),
                      country=np.where(query.country < 0, unseen, query.country))
