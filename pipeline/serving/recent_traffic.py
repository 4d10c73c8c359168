"""The features of the latest payments this service decides for: where a version's review threshold starts.

A version's review threshold comes from its validation days, which are older than the traffic it
will decide. In the demo's portfolio, the validation thresholds of two versions flagged 0.27% of the
next live day against a 0.50% budget, and the live tracker (:mod:`pipeline.decisions.review_tracking`),
which needs ``min_scores`` live scores first, never started on a day of ~6,200 payments. A version
just loaded has no live scores of its own, but the service has the payments it just saw: scoring
their features with the new version tells what share its thresholds would flag *now*. So the
service keeps those features here, and a version's tracker starts from the version's scores on them
(:meth:`pipeline.serving.reloader.ModelReloader`), on a restart and on a hot reload alike.

What enters: the features each scored request was decided on, and, after seeding, those of the raw
store's payments of the latest day (:data:`.features.RECENT_SPAN_US`), or of the expiry margin if that
is shorter (older ones would read windows the online state has already expired, so their features
would not be the ones training builds). Only payments of this partition's own cards. A fixed-size
ring of float64 rows in :data:`FEATURE_COLUMNS` order (``capacity`` x 31 x 8 bytes: 12 MB for
50,000), oldest overwritten first.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

import numpy as np

from pipeline.features.definitions import FEATURE_COLUMNS

FeatureRow = Mapping[str, float | int]


class RecentTraffic:
    def __init__(self, capacity: int, columns: Sequence[str] = FEATURE_COLUMNS) -> None:
        if capacity < 1:
            raise ValueError(f"a recent-traffic ring needs room for at least one payment, got {capacity}")
        self.columns = tuple(columns)
        self.capacity = capacity
        self._rows = np.empty((capacity, len(self.columns)), dtype=np.float64)
        self._next = 0
        self._filled = 0
        self.added = 0  # rows ever added
        self._lock = threading.Lock()  # scored batches and the seed add from different threads

    def __len__(self) -> int:
        return self._filled

    def add(self, rows: Sequence[FeatureRow]) -> None:
        """Append feature rows (oldest first); beyond ``capacity`` the oldest are dropped."""
        if not rows:
            return
        block = np.array([[row[c] for c in self.columns] for row in rows[-self.capacity:]], dtype=np.float64)
        with self._lock:
            start, n = self._next, block.shape[0]
            first = min(n, self.capacity - start)
            self._rows[start:start + first] = block[:first]
            self._rows[:n - first] = block[first:]  # wraps to the front
            self._next = (start + n) % self.capacity
            self._filled = min(self.capacity, self._filled + n)
            self.added += len(rows)

    def matrix(self) -> np.ndarray:
        """A copy of the rows held, oldest first (``len(self) x len(columns)``)."""
        with self._lock:
            if self._filled < self.capacity:
                return self._rows[:self._filled].copy()
            return np.concatenate([self._rows[self._next:], self._rows[:self._next]])
