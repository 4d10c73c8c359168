"""Online features: running window aggregates per card and per merchant, exact to the kernel.

The scoring service keeps an :class:`OnlineFeatureState`, feeds it every payment and fraud report
it sees (from Kafka, or seeded from the raw store), and asks it for the features of a new payment.
The numbers are those the Spark dataset holds for the same payment (tested equal to
:mod:`pipeline.features.kernel` at 1e-9, and bit for bit in practice): the same windows
``[t - w, t)`` over strictly earlier events (same-instant payments do not see each other), the same
integer-cent sums, the same split of squared cents into two 31-bit halves, the same float
operations in the same order, and the same label rule (a fraud report feeds its merchant's rate
``label_delay`` after ``reported_at``, first report only, if the payment happened at most
``label_match_days`` before the report). Time features and categorical codes are the kernel's
and :mod:`.definitions`' own functions.

How: every card and merchant holds its recent events in a :class:`.windows.WindowedLog`, whose
aggregates are the windows of a query at the log's cursor: per card count, cent sum and squared
cent halves over 1 h, 1, 7 and 30 days, merchants per day and merchants, countries and hours of
day per 30 days (distinct-merchant, familiarity and hour-share counters); per merchant the payment
counts and the counts of label-delayed fraud instants over 1, 7 and 30 days. A query slides the cursor to its payment's
time. So a payment in time order costs O(windows), whatever its card or merchant holds: a
merchant with a million payments a month costs what one with a hundred does. A payment ``x``
events behind its key's latest (late arrival), or a back-dated report, costs O(x) and a binary
search, and stays exact (see :mod:`.windows` for each operation's cost).

Memory (measured with tracemalloc on CPython 3.11), bounded by expiry: per card ~1.3 KB (its log,
4 window aggregates and a 24-hour counter) plus ~200 bytes per payment of the last 30 days and the
expiry margin (time, a (cents, merchant, country, hour) row, counter entries). Per merchant ~1 KB
plus 8 bytes per payment of the same span and 8 per fraud instant in it (reports up to
``label_delay`` ahead included). Per payment, for ``label_match_days``: its id, merchant and time
(reports are matched against it), its first fraud report's time and its expiry entries, ~350 bytes
with the strings. Expiry
(:meth:`OnlineFeatureState.expire`) is incremental: every key is filed under the hours of the
events it holds (:class:`_ExpiryIndex`), so a call visits only keys that hold something old, at
most ``budget`` of them, and never walks the whole state.
"""

from __future__ import annotations

import functools
import heapq
import math
import sys
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.features import definitions as fd
from pipeline.features.kernel import MAX_CENTS, US_PER_DAY, US_PER_HOUR, US_PER_SECOND, time_features
from pipeline.features.params import FeatureParams
from pipeline.features.windows import Count, WindowedLog, add_to, take_from


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


VELOCITY_US = fd.VELOCITY_WINDOW_SECONDS * US_PER_SECOND
LOOKBACK_US = fd.LOOKBACK_DAYS * US_PER_DAY
DISTINCT_MERCHANTS_US = US_PER_DAY  # card_distinct_merchants_1d
CARD_WINDOWS_US = tuple(sorted({VELOCITY_US, DISTINCT_MERCHANTS_US, LOOKBACK_US,
                                *(days * US_PER_DAY for days in fd.CARD_WINDOWS_DAYS)}))
MERCHANT_WINDOWS_US = tuple(days * US_PER_DAY for days in fd.MERCHANT_WINDOWS_DAYS)
_CARD_AT = {w: i for i, w in enumerate(CARD_WINDOWS_US)}
_SQ_SPLIT = 31  # the kernel's split of a squared amount into two exact halves
_SQ_LOW_MASK = (1 << _SQ_SPLIT) - 1
_SQ_SCALE = float(1 << _SQ_SPLIT)


# What a card's log holds per payment: (cents, merchant, country, UTC hour).
CardRow = tuple[int, str, str | None, int]


def hour_of(ts_us: int) -> int:
    """:func:`.kernel.hour_of_day` of one instant (Python's floor division is numpy's)."""
    return ts_us // US_PER_HOUR % 24


def cents_of(amount: float) -> int:
    """:func:`.kernel.to_cents` of one amount, without numpy's per-call cost (tested equal)."""
    if math.isnan(amount):
        return 0
    return math.floor(min(max(amount, 0.0), MAX_CENTS / 100) * 100 + 0.5)


class _CardWindow:
    """A card's payments in one window: count, cent sum, squared cents in the kernel's two halves;
    the window's merchants, countries and hours of day counted where a feature reads them (else ``None``)."""

    __slots__ = ("n", "cents", "sq_high", "sq_low", "merchants", "countries", "hours")

    def __init__(self, window_us: int) -> None:
        self.n = self.cents = self.sq_high = self.sq_low = 0
        self.merchants: dict | None = {} if window_us in (DISTINCT_MERCHANTS_US, LOOKBACK_US) else None
        self.countries: dict | None = {} if window_us == LOOKBACK_US else None
        self.hours: list[int] | None = [0] * 24 if window_us == LOOKBACK_US else None

    def add(self, row: CardRow) -> None:
        cents, merchant, country, hour = row
        square = cents * cents
        self.n += 1
        self.cents += cents
        self.sq_high += square >> _SQ_SPLIT
        self.sq_low += square & _SQ_LOW_MASK
        if self.merchants is not None:
            add_to(self.merchants, merchant)
        if self.countries is not None:
            add_to(self.countries, country)
        if self.hours is not None:
            self.hours[hour] += 1

    def remove(self, row: CardRow) -> None:
        cents, merchant, country, hour = row
        square = cents * cents
        self.n -= 1
        self.cents -= cents
        self.sq_high -= square >> _SQ_SPLIT
        self.sq_low -= square & _SQ_LOW_MASK
        if self.merchants is not None:
            take_from(self.merchants, merchant)
        if self.countries is not None:
            take_from(self.countries, country)
        if self.hours is not None:
            self.hours[hour] -= 1

    def near_hour_share(self, hour: int) -> float:
        """Share of the window's payments within ``HOUR_SHARE_REACH`` hours of ``hour`` (the kernel's
        integer count over the same float count)."""
        if self.n == 0:
            return 0.0
        near = sum(self.hours[(hour + shift) % 24] for shift in fd.HOUR_SHARE_SHIFTS)
        return near / float(self.n)

    def moments(self) -> tuple[float, float, float]:
        """Count, mean and sample std of the amounts, in the kernel's float operations and order."""
        n = float(self.n)
        if self.n == 0:
            return n, 0.0, 0.0
        total = float(self.cents)
        mean = total / n / 100
        if self.n == 1:
            return n, mean, 0.0
        total_sq = float(self.sq_high) * _SQ_SCALE + float(self.sq_low)
        variance = (total_sq - total * total / n) / (n - 1)
        return n, mean, math.sqrt(max(variance, 0.0)) / 100


def _card_log() -> WindowedLog:
    return WindowedLog(CARD_WINDOWS_US, lambda i: _CardWindow(CARD_WINDOWS_US[i]), follow=True)


def _count_log(follow: bool) -> WindowedLog:
    return WindowedLog(MERCHANT_WINDOWS_US, lambda i: Count(), keep_rows=False, follow=follow)


class _Merchant:
    __slots__ = ("payments", "frauds")

    def __init__(self) -> None:
        self.payments = _count_log(follow=True)
        # Instants fraud became usable (first report + delay): often ahead of now, so they wait for the queries.
        self.frauds = _count_log(follow=False)


# What a card or merchant never seen reads: empty logs (only their cursors ever change).
_NO_CARD = _card_log()
_NO_MERCHANT = _Merchant()


def card_columns(card: WindowedLog, ts_us: int, amount: float, merchant: str, country: str | None) -> dict[str, float]:
    """The card features of a payment at ``ts_us`` from its card's log (moves the log's cursor)."""
    card.move_to(ts_us)
    windows = card.aggregates
    out: dict[str, float] = {}
    for days in fd.CARD_WINDOWS_DAYS:
        out[fd.card_count(days)], out[fd.card_mean(days)], out[fd.card_std(days)] = (
            windows[_CARD_AT[days * US_PER_DAY]].moments())
    lookback = windows[_CARD_AT[LOOKBACK_US]]
    out[fd.CARD_TX_COUNT_1H] = float(windows[_CARD_AT[VELOCITY_US]].n)
    previous = card.latest_before_cursor()
    out[fd.CARD_SECONDS_SINCE_PREV] = (float(ts_us - previous) / US_PER_SECOND if lookback.n > 0
                                       else fd.NO_PREVIOUS_SECONDS)
    mean30, std30 = out[fd.card_mean(30)], out[fd.card_std(30)]
    out[fd.CARD_AMOUNT_TO_MEAN_30D] = amount / mean30 if mean30 > 0 else fd.NO_HISTORY_AMOUNT_RATIO
    out[fd.CARD_AMOUNT_ZSCORE_30D] = (amount - mean30) / std30 if std30 > 0 else 0.0
    out[fd.CARD_DISTINCT_MERCHANTS_1D] = float(len(windows[_CARD_AT[DISTINCT_MERCHANTS_US]].merchants))
    out[fd.CARD_MERCHANT_TX_COUNT_30D] = float(lookback.merchants.get(merchant, 0))
    out[fd.CARD_COUNTRY_TX_COUNT_30D] = float(lookback.countries.get(country, 0))
    out[fd.CARD_HOUR_SHARE_30D] = lookback.near_hour_share(hour_of(ts_us))
    _add_sequence(out, card, ts_us, merchant, country)
    return out


# Per step, its columns in SEQUENCE_FIELDS order: named once, not on every scored payment.
_SEQUENCE_COLUMNS = tuple(tuple(fd.card_previous(step, field) for field in fd.SEQUENCE_FIELDS)
                          for step in range(1, fd.SEQUENCE_STEPS + 1))
_NO_STEP = (fd.NO_PREVIOUS_SECONDS, 0.0, 0.0, 0.0)  # a step the card has no payment for


def _add_sequence(out: dict[str, float], card: WindowedLog, ts_us: int, merchant: str, country: str | None) -> None:
    """:data:`.definitions.SEQUENCE_FEATURES` of a payment at the card log's cursor: its last
    instants, walked back from the cursor through the lookback window's events (the kernel's runs of
    equal times; a step costs its instant's payments, one but for ties)."""
    times, rows, i = card.ts, card.rows, card.hi - 1
    oldest = card.lo[_CARD_AT[LOOKBACK_US]]
    for columns in _SEQUENCE_COLUMNS:
        if i < oldest:
            out.update(zip(columns, _NO_STEP, strict=True))
            continue
        instant, cents, same_merchant, same_country = times[i], 0, False, False
        while i >= oldest and times[i] == instant:
            row_cents, row_merchant, row_country, _ = rows[i]
            cents += row_cents
            same_merchant |= row_merchant == merchant
            same_country |= row_country == country
            i -= 1
        out.update(zip(columns, (float(ts_us - instant) / US_PER_SECOND, float(cents) / 100,
                                 float(same_merchant), float(same_country)), strict=True))


def merchant_columns(merchant: _Merchant, ts_us: int) -> dict[str, float]:
    """Merchant counts and known-fraud rates of a payment at ``ts_us`` (moves the logs' cursors)."""
    merchant.payments.move_to(ts_us)
    merchant.frauds.move_to(ts_us)
    out: dict[str, float] = {}
    for days, payments, frauds in zip(fd.MERCHANT_WINDOWS_DAYS, merchant.payments.aggregates,
                                      merchant.frauds.aggregates, strict=True):
        out[fd.merchant_count(days)] = float(payments.n)
        out[fd.merchant_fraud_rate(days)] = min(frauds.n / max(payments.n, 1), 1.0)
    return out


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


class OnlineFeatureState:
    """Per-card and per-merchant window aggregates (see the module docstring). Not thread-safe: one writer."""

    def __init__(self, params: FeatureParams) -> None:
        self.params = params
        self._cards: dict[str, WindowedLog] = {}
        self._merchants: dict[str, _Merchant] = {}
        self._payments: dict[str, tuple[str, int]] = {}  # transaction_id -> (merchant_id, ts_us)
        self._first_fraud_report: dict[str, int] = {}  # transaction_id -> earliest fraud report (us)
        self._card_events = 0
        # What expiry visits: cards and merchants by the hours of their events, payments by their hour.
        self._expiring_cards = _ExpiryIndex()
        self._expiring_merchants = _ExpiryIndex()
        self._expiring_payments = _ExpiryIndex()
        self._expiring_orphan_reports = _ExpiryIndex()  # reports of payments not (yet) seen, by report time

    # -- what the stream feeds -------------------------------------------------------------------
    def observe_payment(self, p: Payment, with_card: bool = True) -> None:
        """Add a payment to its card's and merchant's windows (idempotent per transaction_id).
        ``with_card=False``: its merchant's only (a scoring partition holds other partitions' cards
        nowhere, their payments still count for the merchants they share)."""
        if p.transaction_id in self._payments:
            return
        self._payments[p.transaction_id] = (p.merchant_id, p.ts_us)
        self._merchant(p.merchant_id).payments.insert(p.ts_us)
        self._expiring_payments.add(p.ts_us, p.transaction_id)
        self._expiring_merchants.add(p.ts_us, p.merchant_id)
        if with_card:
            self._observe_card(p)
        reported = self._first_fraud_report.get(p.transaction_id)
        if reported is not None:  # the report arrived before its payment
            self._add_fraud_instant(p.transaction_id, reported, None)

    def _observe_card(self, p: Payment) -> None:
        # Interned: a card's rows and its counters share one string per merchant and country.
        row: CardRow = (cents_of(p.amount), sys.intern(p.merchant_id),
                        None if p.country is None else sys.intern(p.country), hour_of(p.ts_us))
        card = self._cards.get(p.card_id)
        if card is None:
            card = self._cards[p.card_id] = _card_log()
        card.insert(p.ts_us, row)
        self._card_events += 1
        self._expiring_cards.add(p.ts_us, p.card_id)

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

    def _merchant(self, merchant_id: str) -> _Merchant:
        merchant = self._merchants.get(merchant_id)
        if merchant is None:
            merchant = self._merchants[merchant_id] = _Merchant()
        return merchant

    def _add_fraud_instant(self, transaction_id: str, reported_us: int, replaced_us: int | None) -> None:
        merchant_id, ts = self._payments[transaction_id]
        frauds = self._merchant(merchant_id).frauds
        match_us = self.params.label_match_days * US_PER_DAY
        if replaced_us is not None and ts >= replaced_us - match_us:
            # False when expiry already dropped it: no window of a payment from now on read it.
            frauds.remove(replaced_us + self.params.label_delay_us)
        if ts >= reported_us - match_us:
            frauds.insert(reported_us + self.params.label_delay_us)
            self._expiring_merchants.add(reported_us + self.params.label_delay_us, merchant_id)

    # -- what scoring asks -----------------------------------------------------------------------
    def features(self, p: Payment) -> dict[str, float | int]:
        """Features of ``p`` as of its own time (earlier events only; ``p`` need not be observed)."""
        return self.features_many((p,))[0]

    def features_many(self, payments: Sequence[Payment]) -> list[dict[str, float | int]]:
        """Features of each payment as of its own time: each row equals :meth:`features` of that
        payment alone. Payments see each other only where they have been observed. Asked in time
        order, so the keys' cursors only move forward within a batch."""
        if not payments:
            return []
        clock = {name: values.tolist() for name, values in
                 time_features(np.array([p.ts_us for p in payments], dtype=np.int64)).items()}
        rows: list[dict[str, float | int]] = [{}] * len(payments)
        for i in sorted(range(len(payments)), key=lambda i: payments[i].ts_us):
            rows[i] = self._row(payments[i], {name: values[i] for name, values in clock.items()})
        return rows

    def _row(self, p: Payment, clock: dict[str, float]) -> dict[str, float | int]:
        amount = float(p.amount)
        columns: dict[str, float | int] = {"amount": amount, **clock}
        columns |= card_columns(self._cards.get(p.card_id, _NO_CARD), p.ts_us, amount, p.merchant_id, p.country)
        columns |= merchant_columns(self._merchants.get(p.merchant_id, _NO_MERCHANT), p.ts_us)
        for name, source in fd.CATEGORICAL_SOURCES.items():
            columns[name] = _code(getattr(p, source), fd.CATEGORICAL_FEATURES[name])
        return {name: columns[name] for name in fd.FEATURE_COLUMNS}

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
            card = self._cards.get(card_id)
            if card is not None:
                self._card_events -= card.drop_before(now_us)
                if not len(card):
                    del self._cards[card_id]
            left -= 1
        for merchant_id in self._expiring_merchants.take_due(merchant_horizon, left):
            merchant = self._merchants.get(merchant_id)
            if merchant is not None:
                merchant.payments.drop_before(now_us)
                merchant.frauds.drop_before(now_us)
                if not len(merchant.payments) and not len(merchant.frauds):
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
