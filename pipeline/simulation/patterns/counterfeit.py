"""Fraud with cloned cards used in person, anchored on the victim's own genuine payments.

* ``compromised_merchant``: skimmers sit on the terminals of a few shops for weeks (a skimming
  :class:`~pipeline.simulation.campaigns.Campaign`); cards that pay there in person are cloned and
  cashed out 2-48 hours later, 1-4 times, at cash machines or shops: 60% in the far country the
  ring works from (each skimmed shop has one), 40% in the victim's own country. Caught by the
  cash-out merchant's recent fraud rate and distance from home; the domestic ones are hard.
* ``geo_impossible``: in-person payments in a far country 10-60 minutes after an in-person
  payment at home: time-and-place consistency of consecutive card-present payments.
"""

from __future__ import annotations

import numpy as np

from pipeline.simulation.blocks import (
    ATM_CHANNEL,
    CARD_PRESENT,
    CONTACTLESS,
    MS_PER_DAY,
    MS_PER_HOUR,
    MS_PER_MINUTE,
    NO_DEVICE,
    EventBlock,
    hash_uniform,
    spaced_times,
)
from pipeline.simulation.campaigns import SKIMMING, Campaign
from pipeline.simulation.patterns.common import (
    FraudContext,
    empty_block,
    fraud_block,
    in_currency,
    pick_on_days,
)
from pipeline.simulation.population import ATM, FAR_COUNTRY_IDX, HOME_COUNTRIES, PHYSICAL

DOMESTIC_CASH_OUT_SHARE = 0.4
CASH_OUT_DELAY_MS = (2 * MS_PER_HOUR, 48 * MS_PER_HOUR)
CASH_OUT_RUN_MS = 4 * MS_PER_HOUR  # room after the first cash-out for the rest of the run
# Skimmed shops get enough in-person visits on the busiest day for this many times the victims wanted.
VISIT_MARGIN = 3.0


def compromised_merchant(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, genuine, window = ctx.population, ctx.genuine, ctx.window
    merchants = pop.merchants
    shop = genuine.merchant
    # A visit needs room after it for the whole cash-out run inside the window.
    visits = np.flatnonzero((genuine.time_ms < window.end_ms - CASH_OUT_DELAY_MS[0] - CASH_OUT_RUN_MS)
                            & (merchants.kind[shop] == PHYSICAL)
                            & (merchants.country[shop] < len(HOME_COUNTRIES))
                            & np.isin(genuine.channel, (CARD_PRESENT, CONTACTLESS)))
    if len(visits) == 0:
        return empty_block()
    visit_day = (genuine.time_ms[visits] - window.start_ms) // MS_PER_DAY
    campaign = _skimming_campaign(ctx, shop[visits], day)
    skimmed_visits = visits[campaign.active(shop[visits], window.start_day_ordinal + visit_day)]
    skimmed_day = (genuine.time_ms[skimmed_visits] - window.start_ms) // MS_PER_DAY
    skimmed = pick_on_days(rng, skimmed_visits, skimmed_day, day, window.days)
    _, once = np.unique(genuine.card[skimmed], return_index=True)  # a card is cloned once
    skimmed = skimmed[np.sort(once)]
    m = len(skimmed)
    if m == 0:
        return empty_block()

    visit_time = genuine.time_ms[skimmed]
    latest = np.minimum(CASH_OUT_DELAY_MS[1], window.end_ms - CASH_OUT_RUN_MS - visit_time)
    first = visit_time + rng.uniform(CASH_OUT_DELAY_MS[0], latest).astype(np.int64)
    sizes = rng.integers(1, 5, m)
    inc = np.repeat(np.arange(m), sizes)
    time_ms = spaced_times(rng, first, sizes, 10 * MS_PER_MINUTE, 60 * MS_PER_MINUTE)

    victim = genuine.card[skimmed]
    ring_country = FAR_COUNTRY_IDX[(hash_uniform(shop[skimmed], np.zeros(m), ctx.seed) * len(FAR_COUNTRY_IDX))
                                   .astype(np.int64)]
    domestic = rng.random(m) < DOMESTIC_CASH_OUT_SHARE
    country = np.where(domestic, pop.cards.home[victim], ring_country)[inc]
    at_atm = rng.random(len(inc)) < 0.7
    cash_shop = pop.groups.pick(rng, country, np.where(at_atm, ATM, PHYSICAL))
    eur = np.where(at_atm, np.round(rng.uniform(100.0, 500.0, len(inc)), -1),
                   rng.lognormal(np.log(250.0), 0.6, len(inc)))
    channel = np.where(at_atm, ATM_CHANNEL, CARD_PRESENT)
    return fraud_block(victim[inc], cash_shop, time_ms, in_currency(pop, cash_shop, eur), channel, NO_DEVICE, inc,
                       window)


def _skimming_campaign(ctx: FraudContext, visited: np.ndarray, day: np.ndarray) -> Campaign:
    """Skimmed shops: home-country shops, as many as give the busiest day enough visits to pick from.

    A larger count only adds shops to a period's set (the set is the lowest-hash candidates), so
    windows that size it differently still agree on the shops they share."""
    merchants = ctx.population.merchants
    candidates = np.flatnonzero((merchants.kind == PHYSICAL) & (merchants.country < len(HOME_COUNTRIES)))
    visits_per_shop_day = len(visited) / max(1, len(candidates)) / ctx.window.days
    wanted_per_day = np.bincount(day).max() if len(day) else 0
    count = int(np.ceil(VISIT_MARGIN * wanted_per_day / max(visits_per_shop_day, 1e-9)))
    return Campaign(ctx.seed, SKIMMING, candidates, min(len(candidates), max(1, count)),
                    ctx.shapes.campaign_days)


def geo_impossible(rng: np.random.Generator, ctx: FraudContext, day: np.ndarray) -> EventBlock:
    pop, genuine, window = ctx.population, ctx.genuine, ctx.window
    shop = genuine.merchant
    at_home = np.flatnonzero(np.isin(genuine.channel, (CARD_PRESENT, CONTACTLESS))
                             & (pop.merchants.country[shop] == pop.cards.home[genuine.card])
                             & (genuine.time_ms < window.end_ms - 2 * MS_PER_HOUR))
    if len(at_home) == 0:
        return empty_block()
    anchor_day = (genuine.time_ms[at_home] - window.start_ms) // MS_PER_DAY
    anchors = pick_on_days(rng, at_home, anchor_day, day, window.days)
    m = len(anchors)
    first = genuine.time_ms[anchors] + rng.integers(10 * MS_PER_MINUTE, 60 * MS_PER_MINUTE, m)
    sizes = rng.integers(1, 4, m)
    inc = np.repeat(np.arange(m), sizes)
    time_ms = spaced_times(rng, first, sizes, 5 * MS_PER_MINUTE, 30 * MS_PER_MINUTE)
    far_shop = pop.groups.pick(rng, rng.choice(FAR_COUNTRY_IDX, m)[inc], PHYSICAL)
    eur = rng.lognormal(np.log(200.0), 0.7, len(inc))
    return fraud_block(genuine.card[anchors][inc], far_shop, time_ms, in_currency(pop, far_shop, eur), CARD_PRESENT,
                       NO_DEVICE, inc, window)
