"""Columnar event blocks: what the generators produce before ids and strings are attached.

Everything here is integer-coded numpy (cards, merchants, channels, devices as indexes), so
generation stays vectorised; :mod:`pipeline.simulation.simulator` turns codes into contract strings once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, date, datetime

import numpy as np

from pipeline.contract import KNOWN_CHANNELS

MS_PER_MINUTE = 60_000
MS_PER_HOUR = 60 * MS_PER_MINUTE
MS_PER_DAY = 24 * MS_PER_HOUR

CARD_PRESENT = KNOWN_CHANNELS.index("card_present")
ECOMMERCE = KNOWN_CHANNELS.index("ecommerce")
ATM_CHANNEL = KNOWN_CHANNELS.index("atm")
CONTACTLESS = KNOWN_CHANNELS.index("contactless")
MOTO = KNOWN_CHANNELS.index("moto")
NO_DEVICE = -1  # payments where the cardholder's device is not involved (shops, cash machines)
NO_INCIDENT = -1  # genuine payments
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


@dataclass(frozen=True)
class Window:
    """The simulated interval ``[start_ms, end_ms)`` in epoch milliseconds (UTC)."""

    start_ms: int
    end_ms: int

    @classmethod
    def of(cls, start: date, days: int) -> Window:
        start_ms = int(datetime(start.year, start.month, start.day, tzinfo=UTC).timestamp() * 1000)
        return cls(start_ms, start_ms + days * MS_PER_DAY)

    @property
    def length_ms(self) -> int:
        return self.end_ms - self.start_ms

    @property
    def start_day_ordinal(self) -> int:
        """Proleptic Gregorian ordinal of the first day (``date.toordinal``): calendar-keyed draws use it."""
        return self.start_ms // MS_PER_DAY + _EPOCH_ORDINAL

    @property
    def days(self) -> int:
        return self.length_ms // MS_PER_DAY


@dataclass(frozen=True)
class EventBlock:
    """Parallel arrays, one element per transaction."""

    card: np.ndarray  # card index
    merchant: np.ndarray  # merchant index
    time_ms: np.ndarray  # epoch ms, inside the window
    amount: np.ndarray  # in the merchant's currency, rounded to cents; > 0 (0 only for enabled zero-amount tests)
    channel: np.ndarray  # index into contract.KNOWN_CHANNELS
    device: np.ndarray  # device code, NO_DEVICE when none
    pattern: np.ndarray  # 0 genuine, 1 + index into config.PATTERNS for fraud
    incident: np.ndarray  # fraud incident id (one attack on one card), NO_INCIDENT for genuine

    def __len__(self) -> int:
        return len(self.card)

    @classmethod
    def concat(cls, blocks: list[EventBlock]) -> EventBlock:
        return cls(**{f.name: np.concatenate([getattr(b, f.name) for b in blocks]) for f in fields(cls)})

    def take(self, index: np.ndarray) -> EventBlock:
        return EventBlock(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def round_amount(amount: np.ndarray) -> np.ndarray:
    """Cents, never below 0.50 (schemes reject zero and negative payments)."""
    return np.maximum(np.round(amount, 2), 0.5)


def fit_in_window(time_ms: np.ndarray, incident: np.ndarray, window: Window) -> np.ndarray:
    """Shift each incident's times back so its last one is inside the window, keeping its spacing;
    an incident longer than the window is squeezed into it. Clipping instead would pile the tails of
    late incidents onto the window's last millisecond."""
    if len(time_ms) == 0:
        return time_ms
    n = int(incident.max()) + 1
    first = np.full(n, np.iinfo(np.int64).max)
    last = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(first, incident, time_ms)
    np.maximum.at(last, incident, time_ms)
    shift = np.minimum(0, window.end_ms - 1 - last)
    start = np.maximum(first + shift, window.start_ms)
    span = np.maximum(last - first, 1)
    scale = np.minimum(1.0, (window.end_ms - 1 - start) / span)
    return start[incident] + ((time_ms - first[incident]) * scale[incident]).astype(np.int64)


def hash_uniform(a: np.ndarray, b: np.ndarray, salt: int | np.uint64) -> np.ndarray:
    """Uniform [0, 1) that depends only on (a, b, salt): splitmix64 finaliser. Used where a draw must
    not depend on the simulated window (a card's travel day, a merchant's campaign)."""
    with np.errstate(over="ignore"):
        x = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
        x = x + np.uint64(salt)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53)


def spaced_times(rng: np.random.Generator, first_ms: np.ndarray, sizes: np.ndarray,
                 gap_low_ms: float, gap_high_ms: float) -> np.ndarray:
    """For each incident ``i``: ``sizes[i]`` times starting at ``first_ms[i]``, uniform gaps, repeated flat."""
    n = int(sizes.sum())
    gaps = rng.uniform(gap_low_ms, gap_high_ms, n)
    starts = np.cumsum(sizes) - sizes
    gaps[starts[sizes > 0]] = 0.0  # the first event of each incident is at first_ms
    cumulative = np.cumsum(gaps)
    base = np.repeat(cumulative[starts[sizes > 0]], sizes[sizes > 0])
    return np.repeat(first_ms, sizes) + (cumulative - base).astype(np.int64)
