"""Online features: the kernel applied to one card's and one merchant's in-memory history.

The scoring service keeps an :class:`OnlineFeatureState`, feeds it every payment and fraud report
it sees (from Kafka, or seeded from the raw store), and asks it for the features of a new payment.
The numbers are those the Spark dataset holds for the same payment (tested to be identical): same
kernel, same integer arithmetic, same label rule (a fraud report feeds its merchant's rate
``label_delay`` after ``reported_at``, first report only, if the payment happened at most
``label_match_days`` before the report).

Memory is bounded by expiry (:meth:`OnlineFeatureState.expire`): payments older than the longest
window, fraud instants older than the longest merchant window, and the payment index that reports
are matched against after ``label_match_days``.
"""

from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass, field

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
from pipeline.features.transforms import FeatureParams


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

    def drop_before(self, ts: int) -> None:
        i = bisect.bisect_left(self.ts, ts)
        del self.ts[:i], self.amount[:i], self.merchant[:i], self.country[:i]


@dataclass
class _MerchantHistory:
    payments: list[int] = field(default_factory=list)
    fraud_known: list[int] = field(default_factory=list)


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

    # -- what the stream feeds -------------------------------------------------------------------
    def observe_payment(self, p: Payment) -> None:
        """Add a payment to its card's and merchant's history (idempotent per transaction_id)."""
        if p.transaction_id in self._payments:
            return
        self._payments[p.transaction_id] = (p.merchant_id, p.ts_us)
        card = self._cards.setdefault(p.card_id, _CardHistory())
        card.insert(p.ts_us, p.amount, self._merchant_codes.code(p.merchant_id), self._country_codes.code(p.country))
        bisect.insort(self._merchants.setdefault(p.merchant_id, _MerchantHistory()).payments, p.ts_us)
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

    def _add_fraud_instant(self, transaction_id: str, reported_us: int, replaced_us: int | None) -> None:
        merchant_id, ts = self._payments[transaction_id]
        history = self._merchants[merchant_id]
        match_us = self.params.label_match_days * US_PER_DAY
        if replaced_us is not None and ts >= replaced_us - match_us:
            history.fraud_known.remove(replaced_us + self.params.label_delay_us)
        if ts >= reported_us - match_us:
            bisect.insort(history.fraud_known, reported_us + self.params.label_delay_us)

    # -- what scoring asks -----------------------------------------------------------------------
    def features(self, p: Payment) -> dict[str, float | int]:
        """Features of ``p`` as of its own time (earlier events only; ``p`` need not be observed)."""
        card = self._cards.get(p.card_id, _CardHistory())
        n = len(card.ts)
        history = CardEvents(key=np.zeros(n, dtype=np.int64), ts_us=np.array(card.ts, dtype=np.int64),
                             amount=np.array(card.amount, dtype=np.float64),
                             merchant=np.array(card.merchant, dtype=np.int64),
                             country=np.array(card.country, dtype=np.int64))
        ts = np.array([p.ts_us], dtype=np.int64)
        query = CardEvents(key=np.zeros(1, dtype=np.int64), ts_us=ts, amount=np.array([p.amount], dtype=np.float64),
                           merchant=np.array([self._merchant_codes.get(p.merchant_id, -1)], dtype=np.int64),
                           country=np.array([self._country_codes.get(p.country, -1)], dtype=np.int64))
        merchant = self._merchants.get(p.merchant_id, _MerchantHistory())
        out: dict[str, float | int] = {}
        for name, values in (card_features(history, _unseen_as_new(query)) | time_features(ts)
                             | merchant_features(_times(merchant.payments), _times(merchant.fraud_known),
                                                 KeyedTimes(np.zeros(1, dtype=np.int64), ts))).items():
            out[name] = float(values[0])
        out["amount"] = float(p.amount)
        raw = {"mcc": p.mcc, "channel": p.channel, "country": p.country}
        out.update({name: _code(raw[source], fd.CATEGORICAL_FEATURES[name])
                     for name, source in fd.CATEGORICAL_SOURCES.items()})
        return {name: out[name] for name in fd.FEATURE_COLUMNS}

    # -- bounded memory --------------------------------------------------------------------------
    def expire(self, now_us: int) -> None:
        """Forget what no feature of a payment at or after ``now_us`` can read."""
        card_horizon = now_us - fd.LOOKBACK_DAYS * US_PER_DAY
        merchant_horizon = now_us - max(fd.MERCHANT_WINDOWS_DAYS) * US_PER_DAY
        for card_id in list(self._cards):
            history = self._cards[card_id]
            history.drop_before(card_horizon)
            if not history.ts:
                del self._cards[card_id]
        for merchant_id in list(self._merchants):
            history = self._merchants[merchant_id]
            del history.payments[:bisect.bisect_left(history.payments, merchant_horizon)]
            del history.fraud_known[:bisect.bisect_left(history.fraud_known, merchant_horizon)]
            if not history.payments and not history.fraud_known:
                del self._merchants[merchant_id]
        # A report made after now can still match payments back to label_match_days before it.
        match_horizon = now_us - self.params.label_match_days * US_PER_DAY
        for transaction_id in [t for t, (_, ts) in self._payments.items() if ts < match_horizon]:
            del self._payments[transaction_id]
            self._first_fraud_report.pop(transaction_id, None)

    def size(self) -> dict[str, int]:
        """Entries held (for /metrics and the expiry test)."""
        return {"cards": len(self._cards), "merchants": len(self._merchants), "payments": len(self._payments),
                "card_events": sum(len(h.ts) for h in self._cards.values())}


@functools.lru_cache(maxsize=65_536)
def _code(value: str | None, buckets: int) -> int:
    """:func:`definitions.categorical_code`, the definition the kernel's vectorised codes use, memoised."""
    return fd.categorical_code(value, buckets)


def _times(values: list[int]) -> KeyedTimes:
    return KeyedTimes(np.zeros(len(values), dtype=np.int64), np.array(values, dtype=np.int64))


def _unseen_as_new(query: CardEvents) -> CardEvents:
    """A merchant/country the state never saw has no earlier payment: give it a code no event has."""
    unseen = np.iinfo(np.int32).max
    return CardEvents(key=query.key, ts_us=query.ts_us, amount=query.amount,
                      merchant=np.where(query.merchant < 0, unseen, query.merchant),
                      country=np.where(query.country < 0, unseen, query.country))
