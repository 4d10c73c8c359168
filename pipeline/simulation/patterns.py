"""Fraud patterns. Each generator returns one :class:`EventBlock` of fraudulent payments for
``n`` incidents (an incident is one attack on one card; ``incident`` numbers them from 0).

Each pattern is caught by a different family of features:

* ``card_testing``: a burst of tiny web payments at one to three digital-goods shops within
  minutes, then a large one: velocity counts over minutes, amount jump, shared fraud device.
* ``account_takeover``: a few web payments of 5-20x the card's mean over hours, on a device the
  card has never used, at foreign web shops: amount-vs-card-history ratio, new device, country.
* ``compromised_merchant``: a skimmed shop; cards that paid there are cloned and cashed out hours
  to two days later at cash machines or shops in a far country used by the ring: merchant-level
  fraud rate, distance from home.
* ``geo_impossible``: in-person payments in a far country 10-60 minutes after an in-person
  payment at home: time-and-place consistency of consecutive card-present payments.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.simulation.blocks import (
    ATM_CHANNEL,
    CARD_PRESENT,
    CONTACTLESS,
    ECOMMERCE,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    NO_DEVICE,
    EventBlock,
    Window,
    round_amount,
    spaced_times,
)
from pipeline.simulation.population import (
    ATM,
    COUNTRY_CURRENCY,
    EUR_TO_CURRENCY,
    FAR_COUNTRY_IDX,
    HOME_COUNTRIES,
    ONLINE,
    PHYSICAL,
    RESELLABLE_MCCS,
    TESTING_MCCS,
    Population,
)

PatternGenerator = Callable[[np.random.Generator, Population, EventBlock, Window, int], EventBlock]


def card_testing(rng: np.random.Generator, pop: Population, genuine: EventBlock, window: Window,
                 n: int) -> EventBlock:
    merchants = pop.merchants
    victims = _victims(rng, pop, n)
    tries = rng.integers(5, 21, n)
    start = window.start_ms + rng.integers(0, max(1, window.length_ms - 2 * MS_PER_HOUR), n)
    tiny_time = spaced_times(rng, start, tries, 5_000, 40_000)
    inc = np.repeat(np.arange(n), tries)
    shops = pop.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, TESTING_MCCS), n * 3)
    shops_used = rng.integers(1, 4, n)
    tiny_shop = shops.reshape(n, 3)[inc, (rng.random(len(inc)) * shops_used[inc]).astype(np.int64)]
    tiny_amount = round_amount(rng.uniform(0.5, 3.0, len(inc)))

    big_time = tiny_time[np.cumsum(tries) - 1] + rng.integers(MS_PER_MINUTE, 30 * MS_PER_MINUTE, n)
    big_shop = pop.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, RESELLABLE_MCCS), n)
    big_amount = _in_currency(pop, big_shop, rng.lognormal(np.log(400.0), 0.5, n))

    device = pop.cards.fraud_devices(rng, n)
    all_inc = np.concatenate([inc, np.arange(n)])
    return _block(victims[all_inc], np.concatenate([tiny_shop, big_shop]),
                  np.concatenate([tiny_time, big_time]), np.concatenate([tiny_amount, big_amount]),
                  ECOMMERCE, device[all_inc], all_inc, window)


def account_takeover(rng: np.random.Generator, pop: Population, genuine: EventBlock, window: Window,
                     n: int) -> EventBlock:
    merchants = pop.merchants
    victims = _victims(rng, pop, n)
    sizes = rng.integers(2, 7, n)
    inc = np.repeat(np.arange(n), sizes)
    start = window.start_ms + rng.integers(0, max(1, window.length_ms - 6 * MS_PER_HOUR), n)
    time_ms = spaced_times(rng, start, sizes, 5 * MS_PER_MINUTE, 90 * MS_PER_MINUTE)
    foreign_web = ((merchants.kind == ONLINE) & np.isin(merchants.mcc, RESELLABLE_MCCS)
                   & (merchants.country >= len(HOME_COUNTRIES)))
    shop = pop.groups.pick_where(rng, foreign_web, len(inc))
    eur = pop.cards.mean_amount()[victims[inc]] * rng.uniform(5.0, 20.0, len(inc))
    device = pop.cards.fraud_devices(rng, n)  # the taker's device: new to this card
    return _block(victims[inc], shop, time_ms, _in_currency(pop, shop, eur), ECOMMERCE, device[inc], inc, window)


def compromised_merchant(rng: np.random.Generator, pop: Population, genuine: EventBlock, window: Window,
                         n: int) -> EventBlock:
    merchants = pop.merchants
    # Skimming needs a visit early enough for the cash-out to fall inside the window.
    horizon = window.start_ms + int(0.7 * window.length_ms)
    shop = genuine.merchant
    visits = np.flatnonzero((genuine.time_ms < horizon) & (merchants.kind[shop] == PHYSICAL)
                            & (merchants.country[shop] < len(HOME_COUNTRIES))
                            & np.isin(genuine.channel, (CARD_PRESENT, CONTACTLESS)))
    if len(visits) == 0:
        return _empty()
    per_shop = np.bincount(shop[visits], minlength=merchants.count)
    candidates = rng.permutation(np.flatnonzero(per_shop))
    # Compromise shops until about twice the wanted victims paid there: half the cards get cloned.
    enough = int(np.searchsorted(np.cumsum(per_shop[candidates]), 2 * n)) + 1
    compromised = candidates[:enough]
    ring_country = np.full(merchants.count, -1)
    ring_country[compromised] = rng.choice(FAR_COUNTRY_IDX, len(compromised))

    at_compromised = visits[np.isin(shop[visits], compromised)]
    _, first_visit = np.unique(genuine.card[at_compromised], return_index=True)
    skimmed = at_compromised[first_visit]
    skimmed = rng.choice(skimmed, size=min(n, len(skimmed)), replace=False)
    m = len(skimmed)
    visit_time = genuine.time_ms[skimmed]
    latest = np.minimum(48 * MS_PER_HOUR, window.end_ms - visit_time - MS_PER_HOUR)
    first = visit_time + rng.uniform(2 * MS_PER_HOUR, np.maximum(latest, 2 * MS_PER_HOUR + 1)).astype(np.int64)
    sizes = rng.integers(1, 5, m)
    inc = np.repeat(np.arange(m), sizes)
    time_ms = spaced_times(rng, first, sizes, 10 * MS_PER_MINUTE, 60 * MS_PER_MINUTE)

    at_atm = rng.random(len(inc)) < 0.7
    country = ring_country[shop[skimmed]][inc]
    cash_shop = pop.groups.pick(rng, country, np.where(at_atm, ATM, PHYSICAL))
    eur = np.where(at_atm, np.round(rng.uniform(200.0, 500.0, len(inc)), -1),
                   rng.lognormal(np.log(300.0), 0.5, len(inc)))
    channel = np.where(at_atm, ATM_CHANNEL, CARD_PRESENT)
    return _block(genuine.card[skimmed][inc], cash_shop, time_ms, _in_currency(pop, cash_shop, eur), channel,
                  NO_DEVICE, inc, window)


def geo_impossible(rng: np.random.Generator, pop: Population, genuine: EventBlock, window: Window,
                   n: int) -> EventBlock:
    merchants = pop.merchants
    shop = genuine.merchant
    at_home = np.flatnonzero(np.isin(genuine.channel, (CARD_PRESENT, CONTACTLESS))
                             & (merchants.country[shop] == pop.cards.home[genuine.card])
                             & (genuine.time_ms < window.end_ms - 2 * MS_PER_HOUR))
    if len(at_home) == 0:
        return _empty()
    anchors = rng.choice(at_home, size=min(n, len(at_home)), replace=False)
    m = len(anchors)
    first = genuine.time_ms[anchors] + rng.integers(10 * MS_PER_MINUTE, 60 * MS_PER_MINUTE, m)
    sizes = rng.integers(1, 4, m)
    inc = np.repeat(np.arange(m), sizes)
    time_ms = spaced_times(rng, first, sizes, 5 * MS_PER_MINUTE, 30 * MS_PER_MINUTE)
    far_shop = pop.groups.pick(rng, rng.choice(FAR_COUNTRY_IDX, m)[inc], PHYSICAL)
    eur = rng.lognormal(np.log(250.0), 0.6, len(inc))
    return _block(genuine.card[anchors][inc], far_shop, time_ms, _in_currency(pop, far_shop, eur), CARD_PRESENT,
                  NO_DEVICE, inc, window)


# name -> (generator, mean fraudulent payments per incident: sizes the incident count)
GENERATORS: dict[str, tuple[PatternGenerator, float]] = {
    "card_testing": (card_testing, 12.5 + 1),
    "account_takeover": (account_takeover, 4.0),
    "compromised_merchant": (compromised_merchant, 2.5),
    "geo_impossible": (geo_impossible, 2.0),
}


def _victims(rng: np.random.Generator, pop: Population, n: int) -> np.ndarray:
    return rng.choice(pop.cards.count, size=n, replace=n > pop.cards.count)


def _in_currency(pop: Population, shop: np.ndarray, eur: np.ndarray) -> np.ndarray:
    return round_amount(eur * EUR_TO_CURRENCY[COUNTRY_CURRENCY[pop.merchants.country[shop]]])


def _block(card: np.ndarray, merchant: np.ndarray, time_ms: np.ndarray, amount: np.ndarray,
           channel: np.ndarray | int, device: np.ndarray | int, incident: np.ndarray, window: Window) -> EventBlock:
    n = len(card)
    return EventBlock(card=card, merchant=merchant, time_ms=np.minimum(time_ms, window.end_ms - 1),
                      amount=amount, channel=np.broadcast_to(channel, n).copy(),
                      device=np.broadcast_to(device, n).astype(np.int64), pattern=np.zeros(n, np.int8),
                      incident=incident.astype(np.int64))


def _empty() -> EventBlock:
    z = np.zeros(0, np.int64)
    return EventBlock(z, z, z, np.zeros(0), z, z, np.zeros(0, np.int8), z)
