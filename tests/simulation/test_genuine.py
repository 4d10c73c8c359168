"""Genuine behaviour that looks like fraud is there, so no single feature separates the two."""

from __future__ import annotations

import dataclasses
from datetime import date

import pandas as pd
import pytest

from pipeline.simulation import GENUINE, SimulationConfig, simulate
from pipeline.simulation.blocks import Window
from pipeline.simulation.genuine import seasonal_factor
from pipeline.simulation.population import FAR_COUNTRIES

SMALL = SimulationConfig(seed=11, start_date="2026-03-02", days=7, num_cards=5000, num_merchants=600)


@pytest.fixture(scope="module")
def genuine() -> pd.DataFrame:
    sim = simulate(SMALL)
    df = sim.transactions.merge(sim.truth, on="transaction_id")
    df = df[df["pattern"] == GENUINE].copy()
    df["t"] = pd.to_datetime(df["event_time"])
    return df


def test_travellers_pay_abroad_in_one_country_a_day(genuine) -> None:
    in_person = genuine[genuine["channel"].isin(["card_present", "contactless", "atm"])]
    far = in_person["country"].isin(FAR_COUNTRIES)
    assert far.mean() > 0.002  # far trips are common enough to overlap with far-away cash-outs
    countries_per_day = in_person.groupby(["card_id", in_person["t"].dt.date])["country"].nunique()
    assert countries_per_day.max() == 1  # never geographically impossible


def test_cardholders_make_big_one_off_purchases_on_their_own_devices(genuine) -> None:
    typical = genuine["card_id"].map(genuine.groupby("card_id")["amount"].median())
    big = genuine[(genuine["amount"] > 5 * typical) & (genuine["channel"] == "ecommerce")]
    share = len(big) / len(genuine)
    assert share > 0.002
    own = genuine[genuine["amount"] <= 5 * typical].groupby("card_id")["device_id"].agg(set)
    seen = [device in own.get(card, set()) for card, device in zip(big["card_id"], big["device_id"], strict=True)]
    assert pd.Series(seen).mean() > 0.5  # the card's phone or laptop, not a stranger's


def test_in_app_micro_bursts_look_like_card_testing_by_amount_and_pace(genuine) -> None:
    tiny = genuine[(genuine["amount"] <= 2.2) & (genuine["mcc"] == "5815")].sort_values(["card_id", "t"])
    gap = tiny.groupby("card_id")["t"].diff()
    assert (gap < pd.Timedelta(minutes=30)).sum() > 0.5 * SMALL.population.micro_burst_rate * SMALL.num_cards * SMALL.days


def test_some_cardholders_shop_at_night(genuine) -> None:
    assert (genuine["t"].dt.hour < 6).mean() > 0.05
    day_only = simulate(dataclasses.replace(SMALL, days=2, population=dataclasses.replace(SMALL.population,
                                                                                          night_owl_share=0.0)))
    hours = pd.to_datetime(day_only.transactions["event_time"]).dt.hour
    assert (hours < 6).mean() < (genuine["t"].dt.hour < 6).mean()


def test_genuine_tickets_peak_before_christmas() -> None:
    december = seasonal_factor(Window.of(date(2026, 12, 14), 3), 0.1)
    june = seasonal_factor(Window.of(date(2026, 6, 14), 3), 0.1)
    assert december.min() > 1.09 and june.max() < 0.92
