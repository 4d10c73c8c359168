"""Realised review and block rates over sliding time windows: per-second counts in a ring.

Counted are scores crossing the thresholds of the version that scored them (the definitions of
:mod:`pipeline.decisions.operating_points`: *flagged* at ``score >= review_threshold``, *blocked* at
``score >= block_threshold``; the review rate is the flagged share, blocks included), not the
decisions: a blocklist or allowlist hit does not move them, and a score that is not a number is
scored but never flagged. After a hot swap a window holds payments judged at each version's own
thresholds, which is what the service decided with.

:meth:`DecisionRates.record` is on the scoring path, once per batch: three integer additions
under a lock held for nothing else (a few microseconds), nothing allocated. Readers (/metrics,
/health, the review-rate check) copy the ring under that lock into a buffer of their own and sum
it with numpy outside it: a read holds the scoring thread up for one copy at most (~0.1 ms for a
day of seconds) and costs ~0.05 ms on an hour's ring, ~1 ms on a day's (measured here). One slot per
second of the longest window; a slot is reused once its second has left every window. Seconds
come from an injectable clock (monotonic by default), so tests move time by hand, not by sleeping.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class WindowCounts:
    """Payments scored, flagged and blocked in the last ``window_s`` seconds (the current one included)."""

    window_s: int
    scored: int
    flagged: int
    blocked: int

    @property
    def review_rate(self) -> float | None:
        """Flagged share; None when nothing was scored."""
        return self.flagged / self.scored if self.scored else None

    @property
    def block_rate(self) -> float | None:
        return self.blocked / self.scored if self.scored else None

    def to_dict(self) -> dict[str, float | int | None]:
        return {"window_s": self.window_s, "payments": self.scored, "flagged": self.flagged, "blocked": self.blocked,
                "review_rate": self.review_rate, "block_rate": self.block_rate}


class DecisionRates:
    """Per-second counts of scored, flagged and blocked payments over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        if horizon_s < 1:
            raise ValueError(f"horizon_s must be >= 1, got {horizon_s}")
        self.horizon_s = horizon_s
        self._clock = clock
        # Four rows of horizon_s slots: the second a slot counts (slot = second % horizon_s; -1: never
        # used), then its scored, flagged and blocked payments; a slot holding an older second is stale.
        # An array.array, so that a record is plain Python integer stores (numpy's scalar ones cost
        # several times more); readers see the same memory as a numpy view.
        self._ring = array("q", [-1] * horizon_s + [0] * (3 * horizon_s))
        self._view = np.frombuffer(self._ring, dtype=np.int64).reshape(4, horizon_s)
        self._lock = threading.Lock()  # the scoring thread and /score/batch's threads both record
        self._copy = np.empty_like(self._view)  # readers sum this copy (allocated once: no page faults per scrape)
        self._copy_lock = threading.Lock()  # /metrics, /health and the periodic check may read together

    def record(self, scored: int, flagged: int, blocked: int) -> None:
        """Count a batch's payments in the current second."""
        now = int(self._clock())
        n = self.horizon_s
        slot = now % n
        ring = self._ring
        with self._lock:
            if ring[slot] != now:  # the slot's second has left every window: start it afresh
                ring[slot], ring[n + slot], ring[2 * n + slot], ring[3 * n + slot] = now, scored, flagged, blocked
            else:
                ring[n + slot] += scored
                ring[2 * n + slot] += flagged
                ring[3 * n + slot] += blocked

    def windows(self, windows_s: Iterable[int]) -> dict[int, WindowCounts]:
        """The counts of each window (seconds, each at most ``horizon_s``), from one copy of the ring."""
        windows_s = tuple(windows_s)
        bad = [w for w in windows_s if not 1 <= w <= self.horizon_s]
        if bad:
            raise ValueError(f"windows {bad} s are outside 1..{self.horizon_s} s (the ring's horizon)")
        out = {}
        with self._copy_lock:
            now = int(self._clock())
            with self._lock:
                np.copyto(self._copy, self._view)
            seconds, counts = self._copy[0], self._copy[1:]
            for window in windows_s:
                inside = (seconds > now - window) & (seconds <= now)
                scored, flagged, blocked = (int(n) for n in np.sum(counts, axis=1, where=inside))
                out[window] = WindowCounts(window, scored, flagged, blocked)
        return out

    def window(self, window_s: int) -> WindowCounts:
        return self.windows((window_s,))[window_s]
