"""Genuine card activity: each card pays at its own rate, hours, ticket size and channel mix, plus
the genuine behaviour that looks like fraud, so that no single feature separates the two:

* travel: on a travel day all the card's in-person payments happen in one foreign country (a
  quarter of trips outside Europe), and none at home, so a genuine trip is never geographically
  impossible but does look like a far-away cash-out;
* big one-off purchases (electronics, flights, hotels) of several times the card's usual ticket,
  on its own device: what an account takeover looks like by amount;
* micro bursts: a few in-app purchases of a euro or two within an hour: what card testing looks
  like by amount and velocity;
* night owls (see :mod:`.population`) and new merchants: half the at-home in-person payments and
  every web payment go to a merchant picked afresh;
* episodes (``population.episode_rate``, off by default): a few days of changed habits (a holiday,
  a move) with extra payments at other hours, in other categories and of bigger tickets, on the
  card's own devices: what a compromise window (:mod:`.patterns.compromise`) looks like.

Genuine tickets swing with the season (``drift.genuine_amount_amplitude``, keyed to the calendar).
"""

from __future__ import annotations

from datetime import date

import numpy as np

from pipeline.simulation.blocks import (
    ATM_CHANNEL,
    CARD_PRESENT,
    CONTACTLESS,
    ECOMMERCE,
    MOTO,
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    NO_DEVICE,
    NO_INCIDENT,
    EventBlock,
    Window,
    fit_in_window,
    hash_uniform,
    round_amount,
    spaced_times,
)
from pipeline.simulation.config import DriftConfig, PopulationConfig
from pipeline.simulation.population import (
    ATM,
    BIG_TICKET_MCCS,
    COUNTRY_CURRENCY,
    DIGITAL_MCC,
    EUR_TO_CURRENCY,
    FAR_COUNTRY_IDX,
    MCC_CODES,
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
CONTACTLESS_LIMIT_EUR = 50.0
SEASON_PEAK_DAY_OF_YEAR = 350  # spending peaks before Christmas


def genuine_block(rng: np.random.Generator, population: Population, window: Window, config: PopulationConfig,
                  drift: DriftConfig) -> EventBlock:
    """Every genuine payment of the window: everyday spending, big one-off purchases, micro bursts."""
    season = seasonal_factor(window, drift.genuine_amount_amplitude)
    trips = Trips(population.cards, config.far_trip_share, rng.integers(1, 2**62, dtype=np.int64))
    blocks = [
        _everyday(rng, population, window, trips, season),
        _big_purchases(rng, population, window, config.big_purchase_rate, trips, season),
        _micro_bursts(rng, population, window, config.micro_burst_rate),
    ]
    if config.episode_rate > 0:  # drawn only when on: presets without episodes keep their random stream
        blocks.append(_episodes(rng, population, window, config.episode_rate, trips, season))
    return EventBlock.concat(blocks)


def seasonal_factor(window: Window, amplitude: float) -> np.ndarray:
    """Per window day, the multiplier of genuine tickets: ``exp(amplitude * cos(season))``."""
    ordinals = range(window.start_day_ordinal, window.start_day_ordinal + window.days)
    day_of_year = np.array([date.fromordinal(o).timetuple().tm_yday for o in ordinals])
    return np.exp(amplitude * np.cos(2 * np.pi * (day_of_year - SEASON_PEAK_DAY_OF_YEAR) / 365.25))


def _everyday(rng: np.random.Generator, population: Population, window: Window, trips: Trips,
              season: np.ndarray) -> EventBlock:
    cards, merchants, days = population.cards, population.merchants, window.days
    counts = rng.poisson(cards.daily_rate * days)
    card = np.repeat(np.arange(cards.count), counts)
    n = len(card)
    day = rng.integers(0, days, n)
    hour = np.mod(cards.peak_hour[card] + cards.hour_spread[card] * rng.standard_normal(n), 24.0)
    time_ms = window.start_ms + day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)

    online = rng.random(n) < cards.online_share[card]
    trip_country = trips.country(card, window.start_day_ordinal + day)
    merchant = _pick_merchants(rng, population, card, online, trip_country)

    mcc = merchants.mcc[merchant]
    eur = season[day] * np.exp(cards.amount_mu[card] + MCC_LOG_FACTOR[mcc]
                               + cards.amount_sigma[card] * rng.standard_normal(n))
    is_atm = merchants.kind[merchant] == ATM
    eur = np.where(is_atm, np.maximum(np.round(eur, -1), 20.0), eur)  # cash machines pay out round sums
    amount = round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[merchants.country[merchant]]])

    contactless = (eur < CONTACTLESS_LIMIT_EUR) & (rng.random(n) < 0.75)
    channel = np.where(online, np.where(mcc == MOTO_MCC, MOTO, ECOMMERCE),
                       np.where(is_atm, ATM_CHANNEL, np.where(contactless, CONTACTLESS, CARD_PRESENT)))
    device = np.where(online, cards.home_devices(card, rng), NO_DEVICE)
    return _genuine(card, merchant, time_ms, amount, channel, device)


def _big_purchases(rng: np.random.Generator, population: Population, window: Window, rate: float, trips: Trips,
                   season: np.ndarray) -> EventBlock:
    """One-off purchases of 3-25x the card's usual ticket: a laptop, a flight, a hotel, a sofa."""
    cards, merchants = population.cards, population.merchants
    card, day = _card_days(rng, cards.count, window.days, rate)
    n = len(card)
    hour = np.mod(cards.peak_hour[card] + cards.hour_spread[card] * rng.standard_normal(n), 24.0)
    time_ms = window.start_ms + day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)
    online = rng.random(n) < 0.6
    web = population.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, BIG_TICKET_MCCS), n)
    shop = population.groups.pick(rng, trips.country(card, window.start_day_ordinal + day), PHYSICAL)
    merchant = np.where(online, web, shop)
    eur = season[day] * cards.mean_amount()[card] * np.exp(rng.uniform(np.log(3.0), np.log(25.0), n))
    amount = round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[merchants.country[merchant]]])
    channel = np.where(online, ECOMMERCE, CARD_PRESENT)
    device = np.where(online, cards.home_devices(card, rng), NO_DEVICE)
    return _genuine(card, merchant, time_ms, amount, channel, device)


def _micro_bursts(rng: np.random.Generator, population: Population, window: Window, rate: float) -> EventBlock:
    """2-6 in-app purchases of 0.50-2.00 at one digital-goods shop, a few minutes apart."""
    cards, merchants = population.cards, population.merchants
    burst_card, burst_day = _card_days(rng, cards.count, window.days, rate)
    m = len(burst_card)
    sizes = rng.integers(2, 7, m)
    hour = np.mod(cards.peak_hour[burst_card] + cards.hour_spread[burst_card] * rng.standard_normal(m), 24.0)
    first = window.start_ms + burst_day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)
    burst = np.repeat(np.arange(m), sizes)
    time_ms = fit_in_window(spaced_times(rng, first, sizes, MS_PER_MINUTE, 15 * MS_PER_MINUTE), burst, window)
    shop = population.groups.pick_where(rng, (merchants.kind == ONLINE) & (merchants.mcc == DIGITAL_MCC), m)
    card, merchant = burst_card[burst], shop[burst]
    eur = rng.choice(np.array([0.5, 0.99, 1.49, 1.99]), len(card))
    amount = round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[merchants.country[merchant]]])
    device = cards.home_devices(burst_card, rng)[burst]
    return _genuine(card, merchant, time_ms, amount, np.full(len(card), ECOMMERCE), device)


EPISODE_DAYS = (2, 5)  # inclusive
EPISODE_PAYMENTS_PER_DAY = 1.8  # extra payments on each episode day (at least one)
EPISODE_HOUR_SHIFT = (3.0, 10.0)  # hours away from the card's peak hour, earlier or later
EPISODE_AMOUNT_FACTOR = 2.2  # lognormal multiple of the card's mean ticket
EPISODE_WEB_SHARE = 0.5
EPISODE_ATM_SHARE = 0.2  # of in-person episode payments: cash for the trip (everyday: ATM_SHARE)
# On the web, a holiday or a move buys flights, electronics and miscellaneous goods.
EPISODE_WEB_MCCS = np.array([MCC_CODES.index(code) for code in ("4511", "5732", "5999")])


def _episodes(rng: np.random.Generator, population: Population, window: Window, rate: float, trips: Trips,
              season: np.ndarray) -> EventBlock:
    """A few days of changed habits: 2-5 days of extra payments at another hour, in other categories,
    of bigger tickets; in person where the card is that day (:class:`Trips`), or on its own devices."""
    cards, merchants = population.cards, population.merchants
    episode_card, first_day = _card_days(rng, cards.count, window.days, rate)
    m = len(episode_card)
    length = rng.integers(EPISODE_DAYS[0], EPISODE_DAYS[1] + 1, m)
    episode_of_day = np.repeat(np.arange(m), length)
    nth_day = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    day_of_episode = np.minimum(first_day[episode_of_day] + nth_day, window.days - 1)  # cut at the window's end
    per_day = 1 + rng.poisson(EPISODE_PAYMENTS_PER_DAY - 1.0, len(episode_of_day))
    episode, day = np.repeat(episode_of_day, per_day), np.repeat(day_of_episode, per_day)
    card, n = episode_card[episode], len(episode)

    shift = rng.uniform(*EPISODE_HOUR_SHIFT, m) * np.where(rng.random(m) < 0.5, -1.0, 1.0)
    hour = np.mod(cards.peak_hour[episode_card][episode] + shift[episode] + 1.5 * rng.standard_normal(n), 24.0)
    time_ms = window.start_ms + day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)

    online = rng.random(n) < EPISODE_WEB_SHARE
    web = population.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, EPISODE_WEB_MCCS), n)
    kind = np.where(rng.random(n) < EPISODE_ATM_SHARE, ATM, PHYSICAL)
    shop = population.groups.pick(rng, trips.country(card, window.start_day_ordinal + day), kind)
    merchant = np.where(online, web, shop)
    eur = season[day] * cards.mean_amount()[card] * rng.lognormal(np.log(EPISODE_AMOUNT_FACTOR), 0.6, n)
    is_atm = merchants.kind[merchant] == ATM
    eur = np.where(is_atm, np.maximum(np.round(eur, -1), 20.0), eur)
    amount = round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[merchants.country[merchant]]])
    channel = np.where(online, ECOMMERCE, np.where(is_atm, ATM_CHANNEL, CARD_PRESENT))
    device = np.where(online, cards.home_devices(card, rng), NO_DEVICE)
    return _genuine(card, merchant, time_ms, amount, channel, device)


def _card_days(rng: np.random.Generator, num_cards: int, days: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """(card, window day) of each event that happens to a card on a day with probability ``rate``."""
    n = rng.binomial(num_cards * days, rate)
    return rng.integers(0, num_cards, n), rng.integers(0, days, n)


def _genuine(card: np.ndarray, merchant: np.ndarray, time_ms: np.ndarray, amount: np.ndarray,
             channel: np.ndarray, device: np.ndarray) -> EventBlock:
    n = len(card)
    return EventBlock(card=card, merchant=merchant, time_ms=time_ms, amount=amount, channel=channel,
                      device=device.astype(np.int64), pattern=np.zeros(n, np.int8),
                      incident=np.full(n, NO_INCIDENT, np.int64))


class Trips:
    """Where each card is on a calendar day: home, or one trip country for the whole day."""

    def __init__(self, cards: Cards, far_trip_share: float, salt: int) -> None:
        self._cards, self._far_share, self._salt = cards, far_trip_share, np.uint64(salt)

    def country(self, card: np.ndarray, day_ordinal: np.ndarray) -> np.ndarray:
        cards = self._cards
        u_travel, u_where, u_far = (hash_uniform(card, day_ordinal, self._salt + np.uint64(k)) for k in range(3))
        near = np.floor(u_where * len(NEAR_COUNTRIES)).astype(np.int64)
        near = np.where(near == cards.home[card], len(NEAR_COUNTRIES) - 1, near)  # abroad, not home again
        far = FAR_COUNTRY_IDX[np.floor(u_where * len(FAR_COUNTRY_IDX)).astype(np.int64)]
        abroad = np.where(u_far < self._far_share, far, near)
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
