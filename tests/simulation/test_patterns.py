"""Each fraud pattern has the shape its docstring promises (read from simulator output and truth)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.simulation import GENUINE, PATTERNS, SimulationConfig, simulate
from pipeline.simulation.blocks import MS_PER_DAY
from pipeline.simulation.patterns import GENERATORS
from pipeline.simulation.patterns.online import threshold_campaign
from pipeline.simulation.population import FAR_COUNTRIES, HOME_COUNTRIES, build_population

# A fraud-heavy fortnight: enough incidents of every pattern to test shapes statistically.
HEAVY = SimulationConfig(seed=11, start_date="2026-03-02", days=14, num_cards=5000, num_merchants=600,
                         fraud_rate=0.03)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    sim = simulate(HEAVY)
    df = sim.transactions.merge(sim.truth, on="transaction_id", validate="one_to_one")
    df["t"] = pd.to_datetime(df["event_time"])
    return df


@pytest.fixture(scope="module")
def genuine(frame) -> pd.DataFrame:
    return frame[frame["pattern"] == GENUINE]


def _typical_amount(genuine: pd.DataFrame, fraud: pd.DataFrame) -> pd.Series:
    return fraud["card_id"].map(genuine.groupby("card_id")["amount"].median())


def test_there_is_one_generator_per_pattern_in_code_order() -> None:
    assert tuple(GENERATORS) == PATTERNS


def test_card_testing_is_a_burst_of_tiny_web_payments_sometimes_cashed_out(frame) -> None:
    fraud = frame[frame["pattern"] == "card_testing"]
    assert (fraud["channel"] == "ecommerce").all()
    cashed_out = []
    for _, card in fraud.groupby("card_id"):
        tiny = card[card["amount"] <= 2.2]  # 0.50-2.00 EUR, in dollars at US shops
        assert len(tiny) >= 3
        assert tiny["t"].max() - tiny["t"].min() < pd.Timedelta(hours=2)
        assert tiny["merchant_id"].nunique() <= 3
        assert set(tiny["mcc"]) <= {"5815", "5999"}
        assert card["device_id"].nunique() == 1
        cashed_out.append(card["amount"].max() > 50 * tiny["amount"].mean())
    assert np.mean(cashed_out) == pytest.approx(HEAVY.fraud_shapes.card_test_cashout_share, abs=0.2)


def test_account_takeover_spends_above_the_card_on_a_new_device_half_abroad(frame, genuine) -> None:
    fraud = frame[frame["pattern"] == "account_takeover"]
    assert (fraud["channel"] == "ecommerce").all()
    assert set(fraud["mcc"]) <= {"5732", "5999", "4511"}
    assert not fraud["device_id"].isin(set(genuine["device_id"].dropna())).any()
    ratio = fraud["amount"] / _typical_amount(genuine, fraud)
    assert ratio.median() > 2.5
    abroad = fraud.groupby("card_id")["country"].first().isin(FAR_COUNTRIES)
    assert 0.25 < abroad.mean() < 0.75


def test_compromised_merchant_victims_are_cashed_out_after_visits_to_a_few_shops(frame, genuine) -> None:
    fraud = frame[frame["pattern"] == "compromised_merchant"]
    assert set(fraud["channel"]) <= {"atm", "card_present"}
    far = fraud.groupby("card_id")["country"].first().isin(FAR_COUNTRIES)
    assert 0.4 < far.mean() < 0.8  # the rest is cashed out at home
    assert fraud["merchant_id"].nunique() < len(fraud)  # a ring reuses its cash machines
    in_person = genuine[genuine["channel"].isin(["card_present", "contactless"])]
    first = fraud.groupby("card_id")["t"].min().rename("first").reset_index()
    visits = _visits_before(first, in_person)
    assert visits["card_id"].nunique() == len(first)  # every victim paid in a shop 2-48 hours before
    # Skimmers sit on a few terminals: the victims' shops overlap far more than those of other cards
    # over the same hours.
    others = first.assign(card_id=np.random.default_rng(0).choice(in_person["card_id"].unique(), len(first),
                                                                   replace=False))
    top_victims = visits.drop_duplicates(["card_id", "merchant_id"])["merchant_id"].value_counts().iloc[0]
    control = _visits_before(others, in_person).drop_duplicates(["card_id", "merchant_id"])
    assert top_victims > 3 * control["merchant_id"].value_counts().iloc[0]


def _visits_before(first: pd.DataFrame, in_person: pd.DataFrame) -> pd.DataFrame:
    """In-person payments of each ``card_id`` 2-48 hours before its ``first`` time."""
    joined = first.merge(in_person, on="card_id")
    return joined[(joined["t"] <= joined["first"] - pd.Timedelta(hours=2))
                  & (joined["t"] >= joined["first"] - pd.Timedelta(hours=48))]


def test_geo_impossible_follows_a_home_payment_within_the_hour(frame) -> None:
    fraud = frame[frame["pattern"] == "geo_impossible"]
    assert (fraud["channel"] == "card_present").all()
    assert fraud["country"].isin(FAR_COUNTRIES).all()
    home = frame[(frame["pattern"] == GENUINE) & frame["country"].isin(HOME_COUNTRIES)
                 & frame["channel"].isin(["card_present", "contactless"])]
    for card_id, card in fraud.groupby("card_id"):
        first = card["t"].min()
        before = home[(home["card_id"] == card_id) & (home["t"] < first)
                      & (home["t"] >= first - pd.Timedelta(minutes=60))]
        assert len(before) > 0, card_id


def test_amount_threshold_fraud_is_above_the_threshold_at_the_rings_current_shops(frame) -> None:
    shapes = HEAVY.fraud_shapes
    fraud = frame[frame["pattern"] == "amount_threshold"]
    assert (fraud["channel"] == "ecommerce").all()
    assert fraud["amount"].between(shapes.threshold_amount, 2.5 * shapes.threshold_amount).all()
    population = build_population(HEAVY.seed, HEAVY.num_cards, HEAVY.num_merchants, HEAVY.tx_per_card_per_day,
                                  HEAVY.population)
    campaign = threshold_campaign(HEAVY.seed, population, shapes)
    merchant = fraud["merchant_id"].str.removeprefix("mer-").astype(int).to_numpy()
    ordinal = fraud["t"].astype("int64").to_numpy() // 10**6 // MS_PER_DAY + 719163  # date(1970, 1, 1).toordinal()
    assert campaign.active(merchant, ordinal).all()
    # Learnable: above the threshold, the targeted shops' payments are far more often fraud than
    # below it, or than above it at other web shops of the same kinds; genuine buyers spend above it too.
    web = frame[(frame["channel"] == "ecommerce") & frame["mcc"].isin(set(fraud["mcc"]))]
    targeted = web["merchant_id"].isin(set(fraud["merchant_id"]))
    above = web["amount"] >= shapes.threshold_amount
    fraud_share_above = web.loc[targeted & above, "is_fraud"].mean()
    assert fraud_share_above > 5 * web.loc[targeted & ~above, "is_fraud"].mean()
    assert fraud_share_above > 3 * web.loc[~targeted & above, "is_fraud"].mean()
    assert (~web.loc[targeted & above, "is_fraud"]).sum() > 0


def test_low_and_slow_mimics_the_cardholder_over_days(frame, genuine) -> None:
    fraud = frame[frame["pattern"] == "low_and_slow"]
    assert set(fraud["channel"]) <= {"ecommerce", "moto"}
    ratio = fraud["amount"] / _typical_amount(genuine, fraud)
    takeover = frame[frame["pattern"] == "account_takeover"]
    assert 0.5 < ratio.median() < 2.0
    assert ratio.median() < (takeover["amount"] / _typical_amount(genuine, takeover)).median() / 2
    span = fraud.groupby("card_id")["t"].agg(lambda t: t.max() - t.min())
    assert span.median() > pd.Timedelta(days=1)
    usual = fraud["card_id"].map(genuine.groupby("card_id")["t"].agg(_mean_hour))
    hour = _hour(fraud["t"])
    distance = np.minimum(abs(hour - usual), 24 - abs(hour - usual))
    assert distance.median() < 3.0
    takeover_usual = takeover["card_id"].map(genuine.groupby("card_id")["t"].agg(_mean_hour))
    takeover_distance = np.minimum(abs(_hour(takeover["t"]) - takeover_usual), 24 - abs(_hour(takeover["t"]) - takeover_usual))
    assert distance.median() < takeover_distance.median() / 1.5  # a taker pays at his own hours


def _hour(t: pd.Series) -> pd.Series:
    return t.dt.hour + t.dt.minute / 60


def _mean_hour(t: pd.Series) -> float:
    """Circular mean hour of day (a night owl's 23:00 and 01:00 average to midnight, not noon)."""
    angle = _hour(t) * 2 * np.pi / 24
    return float(np.mod(np.arctan2(np.sin(angle).mean(), np.cos(angle).mean()) * 24 / (2 * np.pi), 24))
