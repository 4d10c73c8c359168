"""Fraud with stolen card details on the web (all ``ecommerce``, on fraudsters' devices).

* ``card_testing``: a burst of 3-15 tiny payments (0.50-2.00; exactly 0.00 for half of them when
  ``zero_amount_card_tests`` is on) at one to three digital-goods shops, seconds to minutes apart,
  and for ``card_test_cashout_share`` of bursts one large purchase soon after. Overlaps genuine
  in-app micro bursts; caught by velocity over minutes and the amount jump.
* ``account_takeover``: 2-6 purchases over hours at web shops selling resellable goods, half of
  them abroad, of about 4x (lognormal) the card's mean ticket, at any hour. Overlaps genuine big
  one-off purchases; caught by amount against the card's history, velocity, hour.
* ``amount_threshold``: a resale ring buys goods worth ``threshold_amount`` to 2.5x that (in the
  shop's currency) at the web shops of its current campaign (:mod:`..campaigns`), one to three
  times per stolen card. Genuine buyers there spend above the threshold too; what is learnable is
  amount >= threshold at merchants with recent reported fraud.
* ``low_and_slow``: 3-10 purchases over days, one every 0-3 days, at the card's usual hours and
  ticket size (up to 40% more), at ordinary web shops: designed to look like the cardholder.
  Hardly separable with payment features; it keeps recall honest.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.blocks import (
    ECOMMERCE,
    MOTO,
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    EventBlock,
    spaced_times,
)
from pipeline.simulation.campaigns import THRESHOLD, Campaign
from pipeline.simulation.config import FraudShapeConfig
from pipeline.simulation.patterns.common import (
    FraudContext,
    fraud_block,
    in_currency,
    times_in_days,
    victims,
)
from pipeline.simulation.population import (
    BIG_TICKET_MCCS,
    HOME_COUNTRIES,
    MCC_LOG_FACTOR,
    MOTO_MCC,
    ONLINE,
    RESELLABLE_MCCS,
    TESTING_MCCS,
    Population,
)

CARD_TEST_TRIES = (3, 15)  # inclusive range of tiny payments per burst


def card_testing(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, window, n = ctx.population, ctx.window, len(day)
    merchants = pop.merchants
    victim = victims(rng, pop, n)
    tries = rng.integers(CARD_TEST_TRIES[0], CARD_TEST_TRIES[1] + 1, n)
    inc = np.repeat(np.arange(n), tries)
    # Scripted testers fire every ~20 s, careful ones every few minutes.
    gap_ms = np.where(rng.random(n) < 0.7, 20_000, 4 * MS_PER_MINUTE)
    offsets = spaced_times(rng, np.zeros(n, np.int64), tries, 500, 1500) / 1000.0  # in units of gap_ms
    tiny_time = np.repeat(times_in_days(rng, window, day), tries) + (offsets * gap_ms[inc]).astype(np.int64)
    shops = pop.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, TESTING_MCCS), n * 3)
    shops_used = rng.integers(1, 4, n)
    tiny_shop = shops.reshape(n, 3)[inc, (rng.random(len(inc)) * shops_used[inc]).astype(np.int64)]
    tiny_amount = in_currency(pop, tiny_shop, rng.uniform(0.5, 2.0, len(inc)))
    if ctx.shapes.zero_amount_card_tests:
        tiny_amount = np.where(rng.random(len(inc)) < 0.5, 0.0, tiny_amount)

    last_try = np.maximum.reduceat(tiny_time, np.cumsum(tries) - tries)
    cashed = np.flatnonzero(rng.random(n) < ctx.shapes.card_test_cashout_share)
    big_time = last_try[cashed] + rng.integers(MS_PER_MINUTE, 30 * MS_PER_MINUTE, len(cashed))
    big_shop = pop.groups.pick_where(rng, (merchants.kind == ONLINE) & np.isin(merchants.mcc, RESELLABLE_MCCS),
                                     len(cashed))
    big_amount = in_currency(pop, big_shop, rng.lognormal(np.log(400.0), 0.6, len(cashed)))

    device = pop.cards.fraud_devices(rng, n)
    all_inc = np.concatenate([inc, cashed])
    return fraud_block(victim[all_inc], np.concatenate([tiny_shop, big_shop]),
                       np.concatenate([tiny_time, big_time]), np.concatenate([tiny_amount, big_amount]),
                       ECOMMERCE, device[all_inc], all_inc, window)


def account_takeover(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, window, n = ctx.population, ctx.window, len(day)
    merchants = pop.merchants
    victim = victims(rng, pop, n)
    sizes = rng.integers(2, 7, n)
    inc = np.repeat(np.arange(n), sizes)
    time_ms = spaced_times(rng, times_in_days(rng, window, day), sizes, 10 * MS_PER_MINUTE, 3 * MS_PER_HOUR)
    goods = (merchants.kind == ONLINE) & np.isin(merchants.mcc, np.union1d(RESELLABLE_MCCS, BIG_TICKET_MCCS))
    abroad = merchants.country >= len(HOME_COUNTRIES)
    foreign = pop.groups.pick_where(rng, goods & abroad, len(inc))
    domestic = pop.groups.pick_where(rng, goods & ~abroad, len(inc)) if np.any(goods & ~abroad) else foreign
    shop = np.where(np.repeat(rng.random(n) < 0.5, sizes), foreign, domestic)
    eur = pop.cards.mean_amount()[victim[inc]] * rng.lognormal(np.log(4.0), 0.5, len(inc))
    device = pop.cards.fraud_devices(rng, n)  # the taker's device: new to this card
    return fraud_block(victim[inc], shop, time_ms, in_currency(pop, shop, eur), ECOMMERCE, device[inc], inc, window)


def amount_threshold(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, window, n = ctx.population, ctx.window, len(day)
    campaign = threshold_campaign(ctx.seed, pop, ctx.shapes)
    targets = campaign.merchants_on(window.start_day_ordinal + day)  # (incidents, campaign size)
    shop_of_incident = targets[np.arange(n), rng.integers(0, campaign.count, n)]
    sizes = rng.integers(1, 4, n)
    inc = np.repeat(np.arange(n), sizes)
    # The run ends on its start day: the day's campaign shops are the ones it buys at.
    time_ms = spaced_times(rng, times_in_days(rng, window, day, room_ms=4 * MS_PER_HOUR), sizes,
                           10 * MS_PER_MINUTE, 2 * MS_PER_HOUR)
    amount = np.round(ctx.shapes.threshold_amount * rng.uniform(1.0, 2.5, len(inc)), 2)
    device = pop.cards.fraud_devices(rng, n)
    return fraud_block(victims(rng, pop, n)[inc], shop_of_incident[inc], time_ms, amount, ECOMMERCE, device[inc],
                       inc, window)


def threshold_campaign(seed: int, pop: Population, shapes: FraudShapeConfig) -> Campaign:
    """The resale ring's web shops: ``threshold_merchant_share`` of resellable-goods web shops."""
    merchants = pop.merchants
    candidates = np.flatnonzero((merchants.kind == ONLINE) & np.isin(merchants.mcc, RESELLABLE_MCCS))
    count = min(len(candidates), max(1, round(shapes.threshold_merchant_share * len(candidates))))
    return Campaign(seed, THRESHOLD, candidates, count, shapes.campaign_days)


def low_and_slow(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, window, n = ctx.population, ctx.window, len(day)
    cards, merchants = pop.cards, pop.merchants
    victim = victims(rng, pop, n)
    sizes = rng.integers(3, 11, n)
    inc = np.repeat(np.arange(n), sizes)
    card = victim[inc]
    # Whole days between payments, so each stays at the cardholder's usual hour; an incident running
    # past the window starts earlier, one longer than the window wraps round inside it.
    gaps = rng.integers(0, 4, len(inc))
    gaps[np.cumsum(sizes) - sizes] = 0
    offset = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[np.cumsum(sizes) - sizes], sizes)
    length = np.maximum.reduceat(offset, np.cumsum(sizes) - sizes)
    start = np.clip(np.minimum(day, window.days - 1 - length), 0, None)
    pay_day = (start[inc] + offset) % window.days
    hour = np.mod(cards.peak_hour[card] + cards.hour_spread[card] * rng.standard_normal(len(inc)), 24.0)
    time_ms = window.start_ms + pay_day * MS_PER_DAY + (hour * MS_PER_HOUR).astype(np.int64)
    shop = pop.groups.pick_where(rng, merchants.kind == ONLINE, len(inc))
    mcc = merchants.mcc[shop]
    eur = np.exp(cards.amount_mu[card] + MCC_LOG_FACTOR[mcc] + cards.amount_sigma[card] * rng.standard_normal(len(inc)))
    eur = eur * rng.uniform(1.0, 1.4, len(inc))
    channel = np.where(mcc == MOTO_MCC, MOTO, ECOMMERCE)
    device = pop.cards.fraud_devices(rng, n)
    return fraud_block(card, shop, time_ms, in_currency(pop, shop, eur), channel, device[inc], inc, window)
