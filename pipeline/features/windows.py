"""Running window aggregates over one key's events: the online features' per-payment cost, kept flat.

A :class:`WindowedLog` holds the events of one key (a card's payments, a merchant's payments, a
merchant's fraud instants) sorted by time, with a *cursor* ``F`` and, for every window length ``w``,
an aggregate of exactly the events with time in ``[F - w, F)``: the kernel's point-in-time window
(:mod:`pipeline.features.kernel`) of a query at ``F``. Same-instant events are never inside it.
:meth:`WindowedLog.move_to` slides the cursor to a query's time; the aggregates then hold that
query's windows, whatever order events were inserted in.

Cost of each operation, ``n`` the events held, ``k`` the windows:

* :meth:`~WindowedLog.insert`: O(k) when the event is at or after the key's latest one (ordinary
  traffic: an append; with ``follow``, plus the cursor's move to it, amortised O(k)). A late event costs a binary search, O(log n), and a C ``memmove`` of the
  events after it; its time decides at once which aggregates it joins, so it is exact.
* :meth:`~WindowedLog.move_to` ``t``: O(k + d), ``d`` the events that enter or leave a window
  between the old and the new cursor. Queries in time order pay each event once per window
  (amortised O(k) per event); a query behind the cursor (a late payment) pays for the events
  between its time and the cursor's, and between the two window starts, and so does the next
  query in order, which moves the cursor forward again.
* :meth:`~WindowedLog.remove`: O(log n + k) and a ``memmove`` (a fraud instant replaced by an
  earlier report of the same payment).
* :meth:`~WindowedLog.drop_before`: amortised O(1) per event dropped; the dropped prefix is only
  marked (``base``) and cut off once it is half the log, so expiry never moves a big key's array
  on every call.

Memory: the events of ``[F - max(w), ...)`` plus the dropped ones awaiting the cut (fewer than
``COMPACT_AT`` or than the live ones):
8 bytes of time per event (an int64 ``array``), one reference to its row where rows are kept, and
per window one aggregate (see its class).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

NO_CURSOR = -(2**62)  # before any real time: a new log's windows are empty at any cursor up to here
COMPACT_AT = 1024  # dropped events are cut off once at least this many and half the log


class Aggregate(Protocol):
    """Something summed over a window's events: ``add`` when an event enters it, ``remove`` when it leaves."""

    def add(self, row: Any) -> None: ...

    def remove(self, row: Any) -> None: ...


class Count:
    """How many events are in the window (rows are ignored)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def add(self, row: Any) -> None:
        self.n += 1

    def remove(self, row: Any) -> None:
        self.n -= 1


def add_to(counts: dict[Hashable, int], key: Hashable) -> None:
    counts[key] = counts.get(key, 0) + 1


def take_from(counts: dict[Hashable, int], key: Hashable) -> None:
    """One less of ``key``; a key at zero is deleted, so ``len(counts)`` is the number of distinct keys."""
    left = counts[key] - 1
    if left:
        counts[key] = left
    else:
        del counts[key]


class WindowedLog:
    """One key's events by time and an aggregate per window (see the module docstring).

    ``windows_us``: the window lengths; ``make(i)`` builds the aggregate of window ``i``;
    ``keep_rows``: store each event's row (``None`` is passed to the aggregates otherwise);
    ``follow``: an insert after the cursor moves the cursor to it first, so a query after a long run
    of inserts (the seed, or a replica that scores few of the payments it sees) does not pay for all
    of them at once. Not for events stamped ahead of the present (fraud instants: report + delay),
    which would drag the cursor ahead of the queries."""

    __slots__ = ("windows", "follow", "aggregates", "ts", "rows", "base", "cursor", "hi", "lo")  # one per key

    def __init__(self, windows_us: Sequence[int], make: Callable[[int], Aggregate], keep_rows: bool = True,
                 follow: bool = False) -> None:
        self.windows = tuple(windows_us)
        self.follow = follow
        self.aggregates = [make(i) for i in range(len(self.windows))]
        self.ts = array("q")
        self.rows: list[Any] | None = [] if keep_rows else None
        self.base = 0  # events before this index are dropped (cut off later)
        self.cursor = NO_CURSOR
        self.hi = 0  # first event at or after the cursor
        self.lo = [0] * len(self.windows)  # per window: first event at or after cursor - w

    def __len__(self) -> int:
        return len(self.ts) - self.base

    def _row(self, i: int) -> Any:
        return None if self.rows is None else self.rows[i]

    def latest_before_cursor(self) -> int | None:
        """Time of the latest event strictly before the cursor, if one is held."""
        return self.ts[self.hi - 1] if self.hi > self.base else None

    def insert(self, ts: int, row: Any = None) -> None:
        """Add an event at ``ts``, in time order after the events of the same instant."""
        if self.follow and ts > self.cursor:
            self.move_to(ts)
        times = self.ts
        if len(times) == self.base or ts >= times[-1]:  # in order: the common case
            times.append(ts)
            if self.rows is not None:
                self.rows.append(row)
        else:
            i = bisect_right(times, ts, self.base)
            times.insert(i, ts)
            if self.rows is not None:
                self.rows.insert(i, row)
        if ts >= self.cursor:  # after every window: enters them when the cursor passes it
            return
        self.hi += 1
        for k, w in enumerate(self.windows):
            if ts >= self.cursor - w:
                self.aggregates[k].add(row)
            else:
                self.lo[k] += 1

    def remove(self, ts: int, row: Any = None) -> bool:
        """Take out one event at ``ts`` with this ``row``; False when none is held (e.g. dropped)."""
        times = self.ts
        i = bisect_left(times, ts, self.base)
        while i < len(times) and times[i] == ts and self._row(i) != row:
            i += 1
        if i == len(times) or times[i] != ts:
            return False
        if i < self.hi:
            self.hi -= 1
            for k in range(len(self.windows)):
                if i >= self.lo[k]:
                    self.aggregates[k].remove(row)
                else:
                    self.lo[k] -= 1
        del times[i]
        if self.rows is not None:
            del self.rows[i]
        return True

    def move_to(self, t: int) -> None:
        """Slide the cursor to ``t``: every aggregate then holds the events in ``[t - w, t)``."""
        if t > self.cursor:
            self._forward(t)
        elif t < self.cursor:
            self._backward(t)
        self.cursor = t

    def _forward(self, t: int) -> None:
        times, old_hi = self.ts, self.hi
        # What lies after the old cursor is few (events not yet reached): usually nothing to search.
        hi = bisect_left(times, t, old_hi) if old_hi < len(times) and times[old_hi] < t else old_hi
        for k, w in enumerate(self.windows):
            start, lo = t - w, self.lo[k]
            if hi == old_hi and (lo == old_hi or times[lo] >= start):
                continue  # nothing enters or leaves this window: the common case, one comparison
            agg = self.aggregates[k]
            while lo < old_hi and times[lo] < start:  # leave at the bottom
                agg.remove(self._row(lo))
                lo += 1
            if lo == old_hi:  # the whole window moved on: skip entering events already too old
                lo = bisect_left(times, start, old_hi, hi)
            for i in range(max(lo, old_hi), hi):  # enter at the top
                agg.add(self._row(i))
            self.lo[k] = lo
        self.hi = hi

    def _backward(self, t: int) -> None:
        times, old_hi, base = self.ts, self.hi, self.base
        hi = bisect_left(times, t, base, old_hi)
        for k, w in enumerate(self.windows):
            agg, start, lo = self.aggregates[k], t - w, self.lo[k]
            for i in range(max(hi, lo), old_hi):  # leave at the top
                agg.remove(self._row(i))
            lo = min(lo, hi)
            while lo > base and times[lo - 1] >= start:  # enter at the bottom
                lo -= 1
                agg.add(self._row(lo))
            self.lo[k] = lo
        self.hi = hi

    def drop_before(self, t: int) -> int:
        """Forget what no query at or after ``t`` can read (events before ``t - max window``);
        moves the cursor to ``t`` if it is behind. Returns how many events were dropped."""
        if t > self.cursor:
            self.move_to(t)
        # Below every window's start, since the cursor is at or after t.
        cut = bisect_left(self.ts, t - max(self.windows, default=0), self.base, min(self.lo, default=self.hi))
        dropped, self.base = cut - self.base, cut
        if self.base == len(self.ts) or (self.base >= COMPACT_AT and 2 * self.base >= len(self.ts)):
            self._compact()
        return dropped

    def _compact(self) -> None:
        cut = self.base
        del self.ts[:cut]
        if self.rows is not None:
            del self.rows[:cut]
        self.base, self.hi = 0, self.hi - cut
        self.lo = [lo - cut for lo in self.lo]
