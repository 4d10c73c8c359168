"""Genuine card activity: each card pays at its own rate, hours, ticket size and channel mix.

Travel is decided per (card, day): on a travel day all the card's in-person payments happen in
one foreign country and none at home, so a genuine trip never looks geographically impossible.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.blocks import (
    ATM_CHANNEL,
    CARD_PRESENT,
    CONTACTLESS,
    ECOMMERCE,
    MOTO,
    MS_PER_DAY,
    MS_PER_HOUR,
    NO_DEVICE,
    NO_INCIDENT,
    EventBlock,
    Window,
    round_amount,
)
from pipeline.simulation.population import (
    ATM,
    COUNTRY_CURRENCY,
    EUR_TO_CURRENCY,
    FAR_COUNTRY_IDX,
    MCC_LOG_FACTOR,
    MOTO_MCC,
    NEAR_COUNTRIES,
    ONLINE,
    PHYSICAL,
    REGULARS_PER_CARD,
    Cards,
    Population,
)

ATM_SHARE = 0.06  # of in-person payments
REGULAR_SHARE = 0.5  # of at-home in-person payments that go to a regular
FAR_TRIP_SHARE = 0.1  # of travel days spent outside Europe
CONTACTLESS_LIMIT_EUR = 50.0


def genuine_block(rng: np.random.Generator, population: Population, window: Window, days: int) -> EventBlock:
    cards, merchants = population.cards, population.merchants
    counts = rng.poisson(cards.daily_rate * days)
    card = np.repeat(np.arange(cards.count), counts)
    n = len(card)
    day = rng.integers(0, days, n)
    hour = np.mod(cards.peak_hour[card] + cards.hour_spread[card] * rng.standard_normal(n), 24.0)
    time_ms = window.start_ms + day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)

    online = rng.random(n) < cards.online_share[card]
    trip_country = _trip_country(rng, cards, card, day)
    merchant = _pick_merchants(rng, population, card, online, trip_country)

    mcc = merchants.mcc[merchant]
    eur = np.exp(cards.amount_mu[card] + MCC_LOG_FACTOR[mcc] + cards.amount_sigma[card] * rng.standard_normal(n))
    is_atm = merchants.kind[merchant] == ATM
    eur = np.where(is_atm, np.maximum(np.round(eur, -1), 20.0), eur)  # cash machines pay out round sums
    amount = round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[merchants.country[merchant]]])

    contactless = (eur < CONTACTLESS_LIMIT_EUR) & (rng.random(n) < 0.75)
    channel = np.where(online, np.where(mcc == MOTO_MCC, MOTO, ECOMMERCE),
                       np.where(is_atm, ATM_CHANNEL, np.where(contactless, CONTACTLESS, CARD_PRESENT)))
    device = np.where(online, cards.home_devices(card, rng), NO_DEVICE)
    return EventBlock(card=card, merchant=merchant, time_ms=time_ms, amount=amount, channel=channel,
                      device=device, pattern=np.zeros(n, np.int8), incident=np.full(n, NO_INCIDENT))


def _trip_country(rng: np.random.Generator, cards: Cards, card: np.ndarray, day: np.ndarray) -> np.ndarray:
    """Country the card is in on that day: home, or one trip country for the whole day."""
    salt = rng.integers(1, 2**62, dtype=np.int64).astype(np.uint64)
    u_travel, u_where, u_far = (_hash_uniform(card, day, salt + np.uint64(k)) for k in range(3))
    near = np.floor(u_where * len(NEAR_COUNTRIES)).astype(np.int64)
    near = np.where(near == cards.home[card], len(NEAR_COUNTRIES) - 1, near)  # abroad, not home again
    far = FAR_COUNTRY_IDX[np.floor(u_where * len(FAR_COUNTRY_IDX)).astype(np.int64)]
    abroad = np.where(u_far < FAR_TRIP_SHARE, far, near)
    return np.where(u_travel < cards.travel_share[card], abroad, cards.home[card])


def _pick_merchants(rng: np.random.Generator, population: Population, card: np.ndarray, online: np.ndarray,
                    country: np.ndarray) -> np.ndarray:
    n = len(card)
    kind = np.where(rng.random(n) < ATM_SHARE, ATM, PHYSICAL)
    in_person = population.groups.pick(rng, country, kind)
    regular = population.regulars[card, rng.integers(0, REGULARS_PER_CARD, n)]
    at_home = country == population.cards.home[card]
    in_person = np.where(at_home & (kind == PHYSICAL) & (rng.random(n) < REGULAR_SHARE), regular, in_person)
    web = population.groups.pick_where(rng, population.merchants.kind == ONLINE, n)
    return np.where(online, web, in_person)


def _hash_uniform(a: np.ndarray, b: np.ndarray, salt: np.uint64) -> np.ndarray:
    """Uniform [0, 1) that depends only on (a, b, salt): splitmix64 finaliser."""
    with np.errstate(over="ignore"):
        x = a.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + b.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
        x = x + salt
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x >> np.uint64(11)).astype(np.float64) / float(2**53)
