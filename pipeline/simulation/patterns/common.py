"""What every fraud pattern generator receives and the helpers they share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pipeline.simulation.blocks import MS_PER_DAY, EventBlock, Window, fit_in_window, round_amount
from pipeline.simulation.config import FraudShapeConfig
from pipeline.simulation.population import COUNTRY_CURRENCY, EUR_TO_CURRENCY, Population


@dataclass(frozen=True)
class FraudContext:
    """The world a pattern attacks: cards and merchants, the window's genuine payments (victims'
    own payments anchor some patterns), the window, the pattern knobs, and the seed (campaigns)."""

    population: Population
    genuine: EventBlock
    window: Window
    shapes: FraudShapeConfig
    seed: int


# (rng, context, start day of each incident within the window) -> the incidents' payments
PatternGenerator = Callable[[np.random.Generator, FraudContext, np.ndarray], EventBlock]


def victims(rng: np.random.Generator, pop: Population, n: int) -> np.ndarray:
    return rng.choice(pop.cards.count, size=n, replace=n > pop.cards.count)


def times_in_days(rng: np.random.Generator, window: Window, day: np.ndarray, room_ms: int = 0) -> np.ndarray:
    """A uniform instant within each given window day, at least ``room_ms`` before its end."""
    return window.start_ms + day * MS_PER_DAY + rng.integers(0, MS_PER_DAY - room_ms, len(day))


def in_currency(pop: Population, shop: np.ndarray, eur: np.ndarray) -> np.ndarray:
    return round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[pop.merchants.country[shop]]])


def pick_on_days(rng: np.random.Generator, candidates: np.ndarray, candidate_day: np.ndarray,
                 day: np.ndarray, days: int) -> np.ndarray:
    """Distinct ``candidates`` (e.g. genuine payments that anchor an attack), as many from each window
    day as ``day`` asks for; a day with too few candidates gives all it has."""
    order = rng.permutation(len(candidates))
    order = order[np.argsort(candidate_day[order], kind="stable")]  # by day, random within a day
    pool = np.bincount(candidate_day, minlength=days)
    take = np.minimum(np.bincount(day, minlength=days), pool)
    first = np.repeat(np.cumsum(pool) - pool, take)
    rank = np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
    return candidates[order[first + rank]]


def fraud_block(card: np.ndarray, merchant: np.ndarray, time_ms: np.ndarray, amount: np.ndarray,
                channel: np.ndarray | int, device: np.ndarray | int, incident: np.ndarray,
                window: Window) -> EventBlock:
    """Payments of numbered incidents, each incident moved wholly inside the window."""
    n = len(card)
    return EventBlock(card=card, merchant=merchant, time_ms=fit_in_window(time_ms, incident, window),
                      amount=amount, channel=np.broadcast_to(channel, n).copy(),
                      device=np.broadcast_to(device, n).astype(np.int64), pattern=np.zeros(n, np.int8),
                      incident=incident.astype(np.int64))


def empty_block() -> EventBlock:
    z = np.zeros(0, np.int64)
    return EventBlock(z, z, z, np.zeros(0), z, z, np.zeros(0, np.int8), z)
