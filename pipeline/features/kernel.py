"""The one computation of the model's features: numpy arrays of time-ordered events in, feature columns out.

Both paths call these functions: Spark applies them to hash-partitioned, key-sorted partitions
(:mod:`pipeline.features.spark_kernel`), the scoring service to one key's in-memory history
(:mod:`pipeline.features.online`). Same function, same integer arithmetic: the two agree bit for bit.

Semantics (see :mod:`pipeline.features.definitions`): the features of an event at ``t`` use the
key's events with time in ``[t - window, t)``; same-instant events do not see each other; sums of
amounts run over integer cents so nothing depends on the order rows arrive in.

How: event times are replaced by their rank among all distinct times of the call, and each event
gets the position ``segment * width + rank`` on one monotone int64 axis (``segment`` = dense code of
its key, or of its (key, merchant) pair). Every window bound is then one ``np.searchsorted`` and every
windowed sum a difference of prefix sums: O(n log n) for any number of keys, no per-key Python loop.

Inputs are *history* (the events windows look back over; sorted by ``key`` then ``ts_us``) and
*queries* (the events whose features are wanted, any order, keys coded like the history's). Offline
the queries are the history itself; online the history is one card's or merchant's recent events and
the query is the new payment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.features import definitions as fd

US_PER_SECOND = 1_000_000
US_PER_HOUR = 3600 * US_PER_SECOND
US_PER_DAY = fd.DAY_SECONDS * US_PER_SECOND
# Cents are clamped to 2^31 - 1 before sums ($21.4M: beyond any card payment) so a squared amount
# fits in 62 bits and squares can be split into two exact 31-bit prefix-summable halves.
MAX_CENTS = 2**31 - 1
_SQ_SPLIT = 31
_SQ_LOW_MASK = (1 << _SQ_SPLIT) - 1
_NO_NEXT = np.iinfo(np.int64).max
# With more history events than this per query, the hour share searches a sorted copy of the history
# instead of passing over it 24 times (see _near_hour_share).
_SEARCH_ABOVE_EVENTS_PER_QUERY = 10


@dataclass(frozen=True)
class CardEvents:
    """Payments of one or more cards. ``key``: dense card code; ``merchant``/``country``: integer codes
    (any consistent coding of the raw ids within one call); ``amount``: as sent; ``cents``: :func:`to_cents`."""

    key: np.ndarray
    ts_us: np.ndarray
    amount: np.ndarray
    merchant: np.ndarray
    country: np.ndarray

    @property
    def cents(self) -> np.ndarray:
        return to_cents(self.amount)

    def __len__(self) -> int:
        return len(self.ts_us)


@dataclass(frozen=True)
class KeyedTimes:
    """Event times per key (dense codes); sorted by ``(key, ts_us)`` when used as history."""

    key: np.ndarray
    ts_us: np.ndarray


def to_cents(amount: np.ndarray) -> np.ndarray:
    """Amount -> integer cents, rounded half up, clamped to ``[0, MAX_CENTS]`` (NaN -> 0)."""
    amount = np.asarray(amount, dtype=np.float64)
    # NaN -> 0; +-inf need no case of their own: the clip takes them to the bounds (np.nan_to_num
    # would too, through +-max float, at ten times the fixed cost: this runs per scored payment).
    clipped = np.clip(np.where(np.isnan(amount), 0.0, amount), 0.0, MAX_CENTS / 100)
    return np.floor(clipped * 100 + 0.5).astype(np.int64)


class _Axis:
    """Events on one monotone int64 line: ``segment * stride + offset(time)``.

    ``offset`` is the time itself (minus the earliest) when every segment fits, else the time's rank
    among ``times`` (which must then hold every history and query time): either way comparisons of
    positions within a segment are exactly comparisons of times, and a bound up to ``max_window``
    before a segment's first time never reaches the previous segment.
    """

    def __init__(self, times: np.ndarray, segments: int, max_window_us: int) -> None:
        self.origin = int(times.min()) if len(times) else 0
        span = int(times.max()) - self.origin if len(times) else 0
        self.stride = span + max_window_us + 1
        self.ranks = None
        if max(segments, 1) * self.stride >= 2**62:  # rare: ranks keep any number of segments exact
            ordered = np.sort(times)
            self.ranks = ordered[np.concatenate([[True], ordered[1:] != ordered[:-1]])]
            self.stride = len(self.ranks) + 1

    def _offset(self, ts: np.ndarray, side: str) -> np.ndarray:
        if self.ranks is None:
            return ts - self.origin
        return np.searchsorted(self.ranks, ts, side=side) - (1 if side == "right" else 0)

    def position(self, segment: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Position of events at ``ts`` (their times among ``times``), or of a window bound ``ts``:
        ``event position >= position(segment, ts)`` <=> same segment and ``event time >= ts``."""
        return segment * self.stride + self._offset(ts, "left")

    def after(self, segment: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """``p < position(segment, t)`` <=> ``ts < t``, for any ``ts`` and a ``t`` among ``times``."""
        return segment * self.stride + self._offset(ts, "right")


def _prefix(values: np.ndarray) -> np.ndarray:
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=out[1:])
    return out


def _segments(key: np.ndarray) -> int:
    return int(key.max()) + 1 if len(key) else 1


class _PairIndex:
    """The history ordered by (key, value, time), with a dense code per (key, value) pair.

    ``value`` codes must be non-negative integers (merchant or country codes).
    """

    def __init__(self, h: CardEvents, value: np.ndarray, query_key: np.ndarray, query_value: np.ndarray) -> None:
        self.radix = int(max(value.max(initial=0), query_value.max(initial=0))) + 1
        combined = h.key * self.radix + value
        # Stable: the history is sorted by (key, time), so equal pairs stay in time order.
        self.order = np.argsort(combined, kind="stable")
        self.sorted_pairs = combined[self.order]
        change = np.empty(len(combined), dtype=bool)
        change[:1] = True
        np.not_equal(self.sorted_pairs[1:], self.sorted_pairs[:-1], out=change[1:])
        self.sorted_code = np.cumsum(change) - 1
        self.count = int(self.sorted_code[-1]) + 1 if len(combined) else 0
        self.query_pairs = query_key * self.radix + query_value

    def query_codes(self) -> np.ndarray:
        """Code of each query's pair, -1 where the history has no event of that pair."""
        if not len(self.sorted_pairs):
            return np.full(len(self.query_pairs), -1, dtype=np.int64)
        found = np.minimum(np.searchsorted(self.sorted_pairs, self.query_pairs), len(self.sorted_pairs) - 1)
        return np.where(self.sorted_pairs[found] == self.query_pairs, self.sorted_code[found], -1)


def _sorted_segment_window_counts(code: np.ndarray, ts: np.ndarray, window_us: int) -> np.ndarray:
    """Events of the same segment in ``[t - w, t)`` for each event of arrays sorted by (code, ts).

    Segments are laid on one axis in chunks small enough that ``code * stride`` cannot overflow; the
    window bound of each event is then its own position minus ``w`` (sorted needles: fast).
    """
    out = np.empty(len(ts), dtype=np.int64)
    if not len(ts):
        return out
    origin = int(ts.min())
    stride = int(ts.max()) - origin + window_us + 1
    per_chunk = max(2**62 // stride, 1)
    edges = np.searchsorted(code, np.arange(0, int(code[-1]) + per_chunk + 1, per_chunk))
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        if lo == hi:
            continue
        pos = (code[lo:hi] - code[lo]) * stride + (ts[lo:hi] - origin)
        out[lo:hi] = np.searchsorted(pos, pos, side="left") - np.searchsorted(pos, pos - window_us, side="left")
    return out


def _pair_window_count(h: CardEvents, q: CardEvents, pairs: _PairIndex, times: np.ndarray,
                       window_us: int) -> np.ndarray:
    """Per query: history events of the same key with the same value (``pairs``) in ``[t - w, t)``."""
    ts_sorted = h.ts_us[pairs.order]
    if q is h:  # offline: every event is a query; work in pair order and scatter back
        counts = np.empty(len(h), dtype=np.int64)
        counts[pairs.order] = _sorted_segment_window_counts(pairs.sorted_code, ts_sorted, window_us)
        return counts.astype(np.float64)
    axis = _Axis(times, pairs.count, window_us)
    pos = axis.position(pairs.sorted_code, ts_sorted)
    code = pairs.query_codes()
    seg = np.maximum(code, 0)
    end = np.searchsorted(pos, axis.position(seg, q.ts_us), side="left")
    start = np.searchsorted(pos, axis.position(seg, q.ts_us - window_us), side="left")
    return np.where(code >= 0, end - start, 0).astype(np.float64)


def _distinct_in_window(h: CardEvents, merchant_pairs: _PairIndex, axis: _Axis, history_pos: np.ndarray,
                        query_pos: np.ndarray, window_us: int) -> np.ndarray:
    """Distinct merchants among the key's events in ``[t - w, t)``.

    Event ``j`` stands for its merchant at query times ``t`` with ``ts_j < t <= min(ts_j + w, next_j)``
    (``next_j``: the next event of the same key and merchant): exactly one event per merchant present
    in the window. So the count is #{ts_j < t} - #{expiry_j < t}, two searchsorted calls.
    """
    order = merchant_pairs.order
    next_ts = np.full(len(h), _NO_NEXT, dtype=np.int64)
    same = merchant_pairs.sorted_code[1:] == merchant_pairs.sorted_code[:-1]
    next_ts[order[:-1][same]] = h.ts_us[order[1:][same]]
    expires = np.minimum(h.ts_us + window_us, next_ts)
    expiry_pos = np.sort(axis.after(h.key, expires))
    started = np.searchsorted(history_pos, query_pos, side="left")
    expired = np.searchsorted(expiry_pos, query_pos, side="left")
    return (started - expired).astype(np.float64)


@dataclass(frozen=True)
class PairHistories:
    """Parts of a card history, each still sorted by key then time, that hold every event the per-pair
    features can count for the queries at hand. Leaving the other events out changes no value; an
    offline caller with few queries against a long history passes them (:mod:`.arrow_kernel`), so
    those features sort a fraction of the history."""

    merchant: CardEvents  # the events of the queries' (card, merchant) pairs
    # The events from one day before the earliest query on (distinct merchants over a day): an
    # older event has left every query's window, so it adds one to both of the two counts there.
    recent: CardEvents


def _stable_order(values: np.ndarray) -> np.ndarray:
    """Indices that sort non-negative integer ``values`` stably, in linear time: numpy's radix sort
    of 16-bit keys, once per 16 bits of the largest value, least significant first. (Codes of the
    lookback's vocabulary pass 2^16 wherever cards outnumber that: a comparison sort of them cost
    more than the searches it serves.)"""
    top = int(values.max()) if len(values) else 0
    if top < 2**16:
        return np.argsort(values.astype(np.uint16), kind="stable")
    order = np.argsort((values & 0xFFFF).astype(np.uint16), kind="stable")
    for shift in range(16, top.bit_length(), 16):
        order = order[np.argsort(((values[order] >> shift) & 0xFFFF).astype(np.uint16), kind="stable")]
    return order


class _ValueAxis:
    """A (key, time)-sorted history's events grouped by a non-negative integer value (an hour of the
    day, a country code), history order kept within a value: event ``i`` of value ``v`` sits at
    ``v * (len + 1) + i`` on one sorted int64 axis. A query's lookback is one index range
    ``[start, end)`` of the history, so its events of value ``v`` are the axis positions in
    ``[v * (len + 1) + start, v * (len + 1) + end)``: two binary searches per query, however many
    values there are and however the key's events spread over them."""

    def __init__(self, values: np.ndarray) -> None:
        order = _stable_order(values)
        self.width = len(values) + 1
        self.axis = values[order].astype(np.int64) * self.width + order

    def count(self, wanted: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Per query ``i``: the events of value ``wanted[i]`` in the index range ``[start[i], end[i])``.

        Queries in the history's order have ascending bounds; taken by wanted value (stably) every
        needle array ascends too, and numpy's searchsorted starts each search from the previous hit
        (half the time of the same needles in query order, one new day against 31)."""
        by_value = _stable_order(wanted)
        base = wanted[by_value].astype(np.int64) * self.width
        counts = np.empty(len(wanted), dtype=np.int64)
        counts[by_value] = (np.searchsorted(self.axis, base + end[by_value], side="left")
                            - np.searchsorted(self.axis, base + start[by_value], side="left"))
        return counts


def _near_hour_share(h: CardEvents, q: CardEvents, start: np.ndarray, end: np.ndarray, n: np.ndarray) -> np.ndarray:
    """:data:`definitions.CARD_HOUR_SHARE_30D` of each query, whose lookback is ``h[start:end]``
    (``n`` events): the history is sorted by (key, time), so a query's lookback is one index range of it.

    Two ways to count a range's events of the neighbouring hours, the same integers either way: a
    few queries against a long history (one new day) search the history laid out by hour
    (:class:`_ValueAxis`) twice per neighbouring hour; many queries (a full rebuild: about every
    other event is one) take 24 passes over the history instead, each a prefix count of one hour's
    events read at every query of a neighbouring hour. Measured: one new day (0.5M events, 20k
    queries) 11 ms searching (21 ms with the needles in query order); a full rebuild's block (1.1M
    events, 0.53M queries) 0.16 s searching against 0.09 s passing.
    """
    hours = hour_of_day(h.ts_us).astype(np.int8)  # int8: a linear sort, an eighth of the bytes per pass
    query_hours = hours if q is h else hour_of_day(q.ts_us).astype(np.int8)
    near = np.zeros(len(q), dtype=np.int64)
    if len(h) > len(q) * _SEARCH_ABOVE_EVENTS_PER_QUERY:
        by_hour = _ValueAxis(hours)
        for shift in fd.HOUR_SHARE_SHIFTS:
            near += by_hour.count((query_hours.astype(np.int64) + shift) % 24, start, end)
    else:
        by_hour = np.argsort(query_hours, kind="stable")
        edges = np.searchsorted(query_hours[by_hour], np.arange(25))
        counts = np.zeros(len(h) + 1, dtype=np.int64)
        for hour in range(24):
            np.cumsum(hours == hour, out=counts[1:])
            for shift in fd.HOUR_SHARE_SHIFTS:  # the queries at hour - shift have this hour within reach
                queries = by_hour[edges[(hour - shift) % 24]:edges[(hour - shift) % 24 + 1]]
                near[queries] += counts[end[queries]] - counts[start[queries]]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, near / n, 0.0)


def _card_sequence(h: CardEvents, q: CardEvents, cents: np.ndarray, start: np.ndarray, end: np.ndarray) -> dict[str, np.ndarray]:
    """:data:`definitions.SEQUENCE_FEATURES` of each query, whose lookback is ``h[start:end]``.

    The history is sorted by (key, time), so a key's instants are runs of equal times and the
    ``k``-th instant before a query is the run ``k - 1`` runs before the one holding ``end - 1``; it
    is in the lookback when its first event is at or after ``start`` (a run is all or nothing: its
    events share one time), and once one step is not, no older one is. One step at a time, so every
    temporary is one value per query. A run is one event but for ties: the flags compare that
    event, and only the (query, step) pairs whose run holds more are expanded to all its events.
    """
    if not len(h):  # one event no query can see, so the gathers below have something to read
        h, cents = CardEvents(*(np.zeros(1, dtype=np.int64) for _ in range(5))), np.zeros(1, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    new_run = np.ones(len(h), dtype=bool)
    new_run[1:] = (h.key[1:] != h.key[:-1]) | (h.ts_us[1:] != h.ts_us[:-1])
    ties = not new_run.all()
    if ties:
        run_first = np.flatnonzero(new_run)
        run_length = np.diff(run_first, append=len(h))
        run_cents = np.add.reduceat(cents, run_first)
        run = (np.cumsum(new_run) - 1)[np.maximum(end - 1, 0)]
    else:  # every run one event (the common case): run indices are event indices, no pass to number them
        run_cents, run = cents, np.maximum(end - 1, 0)
    present = end > start  # the query's latest run is in its lookback
    for step in range(1, fd.SEQUENCE_STEPS + 1):
        at = np.maximum(run, 0)  # a run index to gather at; ``present`` says whether it is the step's
        first = run_first[at] if ties else at
        present &= (run >= 0) & (first >= start)
        out[fd.card_previous(step, "seconds_before")] = np.where(
            present, (q.ts_us - h.ts_us[first]).astype(np.float64) / US_PER_SECOND, fd.NO_PREVIOUS_SECONDS)
        out[fd.card_previous(step, "amount")] = np.where(present, run_cents[at] / 100, 0.0)
        tied = np.flatnonzero(present & (run_length[at] > 1)) if ties else np.zeros(0, dtype=np.int64)
        if len(tied):
            lengths = run_length[at[tied]]
            offsets = np.cumsum(lengths) - lengths
            events = np.repeat(first[tied] - offsets, lengths) + np.arange(int(lengths.sum()))
        for field, values, query_values in (("same_merchant", h.merchant, q.merchant),
                                            ("same_country", h.country, q.country)):
            same = present & (values[first] == query_values)
            if len(tied):  # any event of the instant, not only its first
                same[tied] = np.logical_or.reduceat(values[events] == np.repeat(query_values[tied], lengths), offsets)
            out[fd.card_previous(step, field)] = same.astype(np.float64)
        run = run - 1
    return out


def card_features(history: CardEvents, queries: CardEvents, pairs: PairHistories | None = None) -> dict[str, np.ndarray]:
    """Card window features of each query from the history (see the module docstring); ``pairs``:
    the parts of ``history`` the per-pair features read (default: all of it)."""
    h, q = history, queries
    times = h.ts_us if q is h else np.concatenate([h.ts_us, q.ts_us])
    lookback = fd.LOOKBACK_DAYS * US_PER_DAY
    axis = _Axis(times, _segments(h.key), lookback)
    h_pos = axis.position(h.key, h.ts_us)
    q_pos = axis.position(q.key, q.ts_us)
    end = np.searchsorted(h_pos, q_pos, side="left")  # first event at or after the query instant
    cents = h.cents
    squares = cents * cents
    sum_cents = _prefix(cents)
    sum_sq_high, sum_sq_low = _prefix(squares >> _SQ_SPLIT), _prefix(squares & _SQ_LOW_MASK)
    out: dict[str, np.ndarray] = {}
    # Every window at once, one row each ([windows, queries] arrays): the same element-wise
    # arithmetic as one window at a time, with a third of the numpy calls, whose fixed cost is most
    # of the online path's time (one payment per call).
    windows_us = [days * US_PER_DAY for days in fd.CARD_WINDOWS_DAYS]
    windows_us += [fd.VELOCITY_WINDOW_SECONDS * US_PER_SECOND, lookback]
    bounds = axis.position(q.key, q.ts_us - np.array(windows_us)[:, None])
    start = np.empty(bounds.shape, dtype=np.int64)
    for row, row_bounds in enumerate(bounds):  # row by row: sorted needles search fastest
        start[row] = np.searchsorted(h_pos, row_bounds, side="left")
    n = (end - start).astype(np.float64)
    total = (sum_cents[end] - sum_cents[start]).astype(np.float64)
    total_sq = ((sum_sq_high[end] - sum_sq_high[start]).astype(np.float64) * float(1 << _SQ_SPLIT)
                + (sum_sq_low[end] - sum_sq_low[start]).astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(n > 0, total / n / 100, 0.0)
        variance = (total_sq - total * total / n) / (n - 1)
        std = np.where(n > 1, np.sqrt(np.maximum(variance, 0.0)) / 100, 0.0)
        for row, days in enumerate(fd.CARD_WINDOWS_DAYS):
            out[fd.card_count(days)], out[fd.card_mean(days)], out[fd.card_std(days)] = n[row], mean[row], std[row]
        out[fd.CARD_TX_COUNT_1H] = n[-2]
        has_previous = n[-1] > 0  # an event in the lookback
        previous = h.ts_us[np.maximum(end - 1, 0)] if len(h) else np.zeros(len(q), dtype=np.int64)
        out[fd.CARD_SECONDS_SINCE_PREV] = np.where(
            has_previous, (q.ts_us - previous).astype(np.float64) / US_PER_SECOND, fd.NO_PREVIOUS_SECONDS)
        mean30, std30 = out[fd.card_mean(30)], out[fd.card_std(30)]
        amount = np.asarray(q.amount, dtype=np.float64)
        out[fd.CARD_AMOUNT_TO_MEAN_30D] = np.where(mean30 > 0, amount / mean30, fd.NO_HISTORY_AMOUNT_RATIO)
        out[fd.CARD_AMOUNT_ZSCORE_30D] = np.where(std30 > 0, (amount - mean30) / std30, 0.0)
    out[fd.CARD_HOUR_SHARE_30D] = _near_hour_share(h, q, start[-1], end, n[-1])
    out |= _card_sequence(h, q, cents, start[-1], end)
    parts = pairs or PairHistories(h, h)
    merchant_pairs = _PairIndex(parts.merchant, parts.merchant.merchant, q.key, q.merchant)
    out[fd.CARD_MERCHANT_TX_COUNT_30D] = _pair_window_count(parts.merchant, q, merchant_pairs, times, lookback)
    recent = parts.recent  # by default the whole history: one sort then serves both merchant features
    recent_pairs = merchant_pairs if recent is parts.merchant else _PairIndex(recent, recent.merchant, q.key, q.merchant)
    recent_pos = h_pos if recent is h else axis.position(recent.key, recent.ts_us)
    out[fd.CARD_DISTINCT_MERCHANTS_1D] = _distinct_in_window(recent, recent_pairs, axis, recent_pos, q_pos, US_PER_DAY)
    if q is h:  # every event a query: counted in (card, country) order, as the merchant pairs are
        country_pairs = _PairIndex(h, h.country, q.key, q.country)
        out[fd.CARD_COUNTRY_TX_COUNT_30D] = _pair_window_count(h, q, country_pairs, times, lookback)
    else:  # a query's lookback is h[start:end]: its country's events there, two searches by country
        out[fd.CARD_COUNTRY_TX_COUNT_30D] = _ValueAxis(h.country).count(q.country, start[-1], end).astype(np.float64)
    return out


def merchant_features(transactions: KeyedTimes, fraud_known: KeyedTimes, queries: KeyedTimes) -> dict[str, np.ndarray]:
    """Merchant transaction counts and known-fraud rates over 1, 7, 30 days.

    ``fraud_known``: per merchant, the instants frauds became usable (report time + label delay),
    sorted by ``(key, ts_us)``. Rate = known frauds in ``[t - w, t)`` / payments in ``[t - w, t)``
    (at least 1), capped at 1.
    """
    tx, fraud, q = transactions, fraud_known, queries
    times = np.concatenate([tx.ts_us, fraud.ts_us] + ([] if q is tx else [q.ts_us]))
    segments = max(_segments(tx.key), _segments(fraud.key), _segments(q.key))
    axis = _Axis(times, segments, max(fd.MERCHANT_WINDOWS_DAYS) * US_PER_DAY)
    tx_pos, fraud_pos = axis.position(tx.key, tx.ts_us), axis.position(fraud.key, fraud.ts_us)
    q_now = axis.position(q.key, q.ts_us)
    tx_end = np.searchsorted(tx_pos, q_now, side="left")
    fraud_end = np.searchsorted(fraud_pos, q_now, side="left")
    out: dict[str, np.ndarray] = {}
    for days in fd.MERCHANT_WINDOWS_DAYS:
        q_start = axis.position(q.key, q.ts_us - days * US_PER_DAY)
        count = tx_end - np.searchsorted(tx_pos, q_start, side="left")
        frauds = fraud_end - np.searchsorted(fraud_pos, q_start, side="left")
        out[fd.merchant_count(days)] = count.astype(np.float64)
        out[fd.merchant_fraud_rate(days)] = np.minimum(frauds / np.maximum(count, 1), 1.0)
    return out


def hour_of_day(ts_us: np.ndarray) -> np.ndarray:
    """UTC hour (0-23) of each instant, before 1970 too (floor division)."""
    return np.floor_divide(ts_us, US_PER_HOUR) % 24


def time_features(ts_us: np.ndarray) -> dict[str, np.ndarray]:
    """UTC hour, weekday (0 = Monday), night and weekend flags, as float64."""
    hour = hour_of_day(ts_us)
    weekday = (np.floor_divide(ts_us, US_PER_DAY) + 3) % 7  # 1970-01-01 was a Thursday
    return {"hour": hour.astype(np.float64), "weekday": weekday.astype(np.float64),
            "is_night": (hour < fd.NIGHT_END_HOUR).astype(np.float64),
            "is_weekend": (weekday >= 5).astype(np.float64)}


def categorical_codes(raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Hashed codes (:func:`definitions.categorical_code`) of the raw fields, one hash per distinct value."""
    out = {}
    for column, buckets in fd.CATEGORICAL_FEATURES.items():
        values = np.asarray(raw[fd.CATEGORICAL_SOURCES[column]], dtype=object)
        uniques, inverse = np.unique(np.where(values == None, "", values).astype(str),  # noqa: E711
                                     return_inverse=True)
        codes = np.fromiter((fd.categorical_code(u, buckets) for u in uniques), dtype=np.int32, count=len(uniques))
        out[column] = codes[inverse.reshape(-1)] if len(values) else np.zeros(0, dtype=np.int32)
    return out
