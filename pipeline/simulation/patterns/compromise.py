"""Fraud through a compromised card used for a few days: the compromise window.

* ``compromise_window``: from its start day, a stolen card is used for 2 to ``compromise_days``
  consecutive days, on each of them one or more times (``compromise_payments_per_day`` on average),
  while the cardholder keeps paying as usual. Inside the window everything the card does shifts
  away from its own habits:

  - hour of day: the fraudster pays around his own hour, 6-12 hours after the cardholder's;
  - merchant category: online, electronics, digital goods and airline tickets on the fraudster's
    device; in person (``compromise_in_person_share`` of windows, a cloned card),
    cash machines and department stores, in the victim's country or a far one;
  - amount: about 3x (lognormal) the card's mean ticket, growing by a quarter every day of the
    window as the fraudster gains confidence.

  Caught by features that compare a card with its own recent past (hour and category mix, amount
  percentiles, velocity over days); genuine episodes (:mod:`...genuine`: a holiday, a move) shift
  the same way on the cardholder's own devices, so the shift alone is not proof.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.blocks import (
    ATM_CHANNEL,
    CARD_PRESENT,
    ECOMMERCE,
    MS_PER_DAY,
    MS_PER_HOUR,
    NO_DEVICE,
    EventBlock,
)
from pipeline.simulation.config import FraudShapeConfig
from pipeline.simulation.patterns.common import FraudContext, fraud_block, in_currency, victims
from pipeline.simulation.population import (
    ATM,
    FAR_COUNTRY_IDX,
    MCC_CODES,
    ONLINE,
    PHYSICAL,
    Population,
)

MIN_WINDOW_DAYS = 2
HOUR_SHIFT = (6.0, 12.0)  # hours after the cardholder's peak hour around which the fraudster pays
HOUR_SPREAD = 1.5  # std of the fraudster's payment hour
AMOUNT_FACTOR, AMOUNT_SIGMA = 3.0, 0.5  # lognormal multiple of the card's mean ticket
ESCALATION_PER_DAY = 0.25  # amounts grow by this share of the first day's with every window day
FAR_SHARE = 0.4  # of in-person windows, cashed out in a far country (the rest at the victim's home)
ATM_SHARE = 0.6  # of in-person payments, at cash machines (the rest at department stores)
WEB_MCCS = np.array([MCC_CODES.index(code) for code in ("5732", "5815", "4511")])  # goods that resell or cash out
STORE_MCC = MCC_CODES.index("5311")


def mean_window_events(shapes: FraudShapeConfig) -> float:
    """Mean fraud payments per window: mean length times mean payments per day."""
    return (MIN_WINDOW_DAYS + shapes.compromise_days) / 2 * shapes.compromise_payments_per_day


def compromise_window(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, window, shapes, n = ctx.population, ctx.window, ctx.shapes, len(day)
    cards = pop.cards
    victim = victims(rng, pop, n)
    length = np.minimum(rng.integers(MIN_WINDOW_DAYS, shapes.compromise_days + 1, n), window.days)
    start = np.clip(np.minimum(day, window.days - length), 0, None)  # a window running past the end starts earlier
    window_of_day = np.repeat(np.arange(n), length)
    day_in_window = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    per_day = 1 + rng.poisson(shapes.compromise_payments_per_day - 1.0, len(window_of_day))
    inc = np.repeat(window_of_day, per_day)
    nth_day = np.repeat(day_in_window, per_day)
    card = victim[inc]

    fraud_hour = np.mod(cards.peak_hour[victim] + rng.uniform(*HOUR_SHIFT, n), 24.0)
    hour = np.mod(fraud_hour[inc] + HOUR_SPREAD * rng.standard_normal(len(inc)), 24.0)
    time_ms = window.start_ms + (start[inc] + nth_day) * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)

    in_person = (rng.random(n) < shapes.compromise_in_person_share)[inc]
    country = np.where(rng.random(n) < FAR_SHARE, rng.choice(FAR_COUNTRY_IDX, n), cards.home[victim])[inc]
    at_atm = in_person & (rng.random(len(inc)) < ATM_SHARE)
    shop = np.where(in_person, _stores(rng, pop, country), _web_shops(rng, pop, len(inc)))
    shop = np.where(at_atm, pop.groups.pick(rng, country, ATM), shop)

    eur = (cards.mean_amount()[card] * rng.lognormal(np.log(AMOUNT_FACTOR), AMOUNT_SIGMA, len(inc))
           * (1.0 + ESCALATION_PER_DAY * nth_day))
    eur = np.where(at_atm, np.maximum(np.round(eur, -1), 20.0), eur)  # cash machines pay out round sums
    channel = np.where(in_person, np.where(at_atm, ATM_CHANNEL, CARD_PRESENT), ECOMMERCE)
    device = np.where(in_person, NO_DEVICE, cards.fraud_devices(rng, n)[inc])  # one device per window
    return fraud_block(card, shop, time_ms, in_currency(pop, shop, eur), channel, device, inc, window)


def _web_shops(rng: np.random.Generator, pop: Population, n: int) -> np.ndarray:
    merchants = pop.merchants
    return pop.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, WEB_MCCS), n)


def _stores(rng: np.random.Generator, pop: Population, country: np.ndarray) -> np.ndarray:
    """A department store in each payment's country, or any shop there where it has none."""
    merchants = pop.merchants
    out = pop.groups.pick(rng, country, PHYSICAL)
    for c in np.unique(country):
        stores = np.flatnonzero((merchants.country == c) & (merchants.mcc == STORE_MCC))
        rows = np.flatnonzero(country == c)
        if len(stores):
            out[rows] = stores[rng.integers(0, len(stores), len(rows))]
    return out
