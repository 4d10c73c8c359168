"""Merchant campaigns: fixed per period by seed and calendar, moving on between periods."""

from __future__ import annotations

import numpy as np

from pipeline.simulation.campaigns import SKIMMING, THRESHOLD, Campaign

CANDIDATES = np.arange(100, 400, 3)
CAMPAIGN = Campaign(seed=9, kind=SKIMMING, candidates=CANDIDATES, count=5, period_days=14)
DAY0 = 14 * 52_000  # the first day of a period


def test_a_period_keeps_its_merchants_and_the_next_one_moves_on() -> None:
    table = CAMPAIGN.merchants_on(DAY0 + np.arange(28))
    assert table.shape == (28, 5)
    assert np.isin(table, CANDIDATES).all()
    assert all(len(set(row)) == 5 for row in table)
    assert (table[:14] == table[0]).all() and (table[14:] == table[14]).all()
    assert len(set(table[0]) & set(table[14])) < 5


def test_a_bigger_campaign_only_adds_merchants() -> None:
    bigger = Campaign(seed=9, kind=SKIMMING, candidates=CANDIDATES, count=12, period_days=14)
    small, large = CAMPAIGN.merchants_on(np.array([DAY0]))[0], bigger.merchants_on(np.array([DAY0]))[0]
    assert set(small) <= set(large)


def test_kinds_and_seeds_draw_their_own_merchants() -> None:
    day = np.array([DAY0])
    threshold = Campaign(seed=9, kind=THRESHOLD, candidates=CANDIDATES, count=5, period_days=14)
    other_seed = Campaign(seed=10, kind=SKIMMING, candidates=CANDIDATES, count=5, period_days=14)
    mine = set(CAMPAIGN.merchants_on(day)[0])
    assert mine != set(threshold.merchants_on(day)[0])
    assert mine != set(other_seed.merchants_on(day)[0])


def test_active_agrees_with_the_period_table() -> None:
    days = DAY0 + np.array([0, 0, 13, 14, 20, 27])
    table = CAMPAIGN.merchants_on(days)
    merchant = np.array([table[0, 0], CANDIDATES[0], table[2, 4], table[0, 1], table[4, 2], table[0, 2]])
    expected = [bool(np.isin(m, row)) for m, row in zip(merchant, table, strict=True)]
    assert list(CAMPAIGN.active(merchant, days)) == expected
    assert expected[0] and expected[2] and expected[4]
