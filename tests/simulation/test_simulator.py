"""Simulator statistics, contract conformance, determinism and id uniqueness."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.config import ConfigError
from pipeline.contract import Kind, parse_rfc3339, validate_event
from pipeline.simulation import GENUINE, PATTERNS, SimulationConfig, load_simulation_config, simulate
from pipeline.simulation.population import FAR_COUNTRIES, HOME_COUNTRIES
from pipeline.simulation.simulator import LABEL_COLUMNS, TRANSACTION_COLUMNS

SMALL = SimulationConfig(seed=11, start_date="2026-03-02", days=7, num_cards=5000, num_merchants=600)


@pytest.fixture(scope="module")
def sim():
    return simulate(SMALL)


@pytest.fixture(scope="module")
def frame(sim) -> pd.DataFrame:
    """Transactions joined with truth, times parsed."""
    df = sim.transactions.merge(sim.truth, on="transaction_id", validate="one_to_one")
    df["t"] = pd.to_datetime(df["event_time"])
    return df


def test_columns_are_the_contract_and_rows_sorted(sim) -> None:
    assert tuple(sim.transactions.columns) == TRANSACTION_COLUMNS
    assert tuple(sim.labels.columns) == LABEL_COLUMNS
    assert list(sim.truth["transaction_id"]) == list(sim.transactions["transaction_id"])
    assert sim.transactions["event_time"].is_monotonic_increasing
    assert sim.labels["reported_at"].is_monotonic_increasing
    assert sim.transactions["transaction_id"].is_unique
    assert sim.transactions["event_time"].str.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$").all()
    assert sim.transactions["event_time"].iloc[0] >= "2026-03-02T00:00:00.000Z"
    assert sim.transactions["event_time"].iloc[-1] < "2026-03-09T00:00:00.000Z"


def test_fraud_rate_follows_config_and_every_pattern_is_present(sim) -> None:
    counts = sim.pattern_counts()
    assert set(counts) == {GENUINE, *PATTERNS}
    assert all(counts[p] > 0 for p in PATTERNS), counts
    rate = sim.truth["is_fraud"].mean()
    assert rate == pytest.approx(SMALL.fraud_rate, rel=0.25)
    assert sim.truth["is_fraud"].equals(sim.truth["pattern"] != GENUINE)

    heavy = simulate(dataclasses.replace(SMALL, fraud_rate=0.03, days=2))
    assert heavy.truth["is_fraud"].mean() == pytest.approx(0.03, rel=0.2)


def test_every_record_passes_contract_validation(sim) -> None:
    for kind, records in ((Kind.TRANSACTION, sim.transaction_records()), (Kind.LABEL, sim.label_records())):
        n = 0
        for record in records:
            parsed, rejection = validate_event(json.dumps(record), kind)
            assert rejection is None, (record, rejection)
            assert parsed == record
            n += 1
        assert n == len(sim.transactions if kind is Kind.TRANSACTION else sim.labels)
    first = next(sim.transaction_records())
    assert type(first["schema_version"]) is int and type(first["amount"]) is float


def test_labels_refer_to_existing_transactions_after_their_time(sim, frame) -> None:
    labels = sim.labels.merge(frame, on="transaction_id", how="left", suffixes=("", "_truth"))
    assert labels["event_time"].notna().all()
    reported = pd.to_datetime(labels["reported_at"])
    assert (reported >= labels["t"]).all()
    # Fraud reports only for true fraud; explicit clearances only for genuine payments.
    assert (labels["is_fraud"] == labels["is_fraud_truth"]).all()
    assert set(labels.loc[~labels["is_fraud"], "source"]) == {"manual_review"}
    assert labels["is_fraud"].any() and (~labels["is_fraud"]).any()
    # Reports take days: most arrive more than a day after the payment, some after the window.
    delay_days = (reported - labels["t"]).dt.total_seconds()[labels["is_fraud"]] / 86400
    assert delay_days.median() > 2.0
    assert (labels["reported_at"] >= "2026-03-09").any()


def test_unreported_share_leaves_fraud_unlabelled() -> None:
    base = dataclasses.replace(SMALL, days=2, cleared_report_rate=0.0)
    every = simulate(dataclasses.replace(base, unreported_fraud_share=0.0))
    none = simulate(dataclasses.replace(base, unreported_fraud_share=1.0))
    assert len(every.labels) == int(every.truth["is_fraud"].sum())
    assert len(none.labels) == 0


def test_card_testing_is_a_burst_of_tiny_web_payments_then_a_large_one(frame) -> None:
    fraud = frame[frame["pattern"] == "card_testing"]
    assert (fraud["channel"] == "ecommerce").all()
    for _, card in fraud.groupby("card_id"):
        tiny = card[card["amount"] <= 3.0]
        assert len(tiny) >= 5
        assert tiny["t"].max() - tiny["t"].min() < pd.Timedelta(minutes=15)
        assert tiny["merchant_id"].nunique() <= 3
        assert card["amount"].max() > 50 * tiny["amount"].mean()
        assert card["device_id"].nunique() == 1


def test_account_takeover_spends_far_above_the_card_on_a_new_device_abroad(frame) -> None:
    fraud = frame[frame["pattern"] == "account_takeover"]
    genuine = frame[frame["pattern"] == GENUINE]
    assert (fraud["channel"] == "ecommerce").all()
    assert not fraud["country"].isin(HOME_COUNTRIES).any()
    own_devices = set(genuine["device_id"].dropna())
    assert not fraud["device_id"].isin(own_devices).any()
    typical = genuine.groupby("card_id")["amount"].median()
    ratio = fraud["amount"] / fraud["card_id"].map(typical)
    assert ratio.median() > 4.0


def test_compromised_merchant_victims_are_cashed_out_abroad_after_a_shop_visit(frame) -> None:
    fraud = frame[frame["pattern"] == "compromised_merchant"]
    assert set(fraud["channel"]) <= {"atm", "card_present"}
    assert fraud["country"].isin(FAR_COUNTRIES).all()
    # A ring reuses its cash machines: far fewer cash-out merchants than payments.
    assert fraud["merchant_id"].nunique() < len(fraud)
    in_person = frame[(frame["pattern"] == GENUINE) & frame["channel"].isin(["card_present", "contactless"])]
    for card_id, card in fraud.groupby("card_id"):
        first = card["t"].min()
        visits = in_person[(in_person["card_id"] == card_id) & (in_person["t"] <= first - pd.Timedelta(hours=2))
                           & (in_person["t"] >= first - pd.Timedelta(hours=48))]
        assert len(visits) > 0, card_id


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


def test_same_config_is_identical_and_other_seed_differs(sim) -> None:
    from pipeline.simulation import simulator

    simulator._population.cache_clear()  # rebuild the population too, not only the window
    again = simulate(SMALL)
    pd.testing.assert_frame_equal(again.transactions, sim.transactions)
    pd.testing.assert_frame_equal(again.labels, sim.labels)
    pd.testing.assert_frame_equal(again.truth, sim.truth)
    other = simulate(dataclasses.replace(SMALL, seed=12))
    assert len(other.transactions) != len(sim.transactions) or not other.transactions.equals(sim.transactions)
    assert not np.array_equal(other.transactions["amount"].to_numpy()[:100],
                              sim.transactions["amount"].to_numpy()[:100])


def test_next_window_keeps_the_cards_but_never_reuses_an_id() -> None:
    night1 = simulate(dataclasses.replace(SMALL, days=1, start_date="2026-03-02"))
    night2 = simulate(dataclasses.replace(SMALL, days=1, start_date="2026-03-03"))
    assert not set(night1.transactions["transaction_id"]) & set(night2.transactions["transaction_id"])
    assert night2.transactions["event_time"].iloc[0] >= "2026-03-03"
    # Same seed, same population: most cards active on both nights.
    shared = set(night1.transactions["card_id"]) & set(night2.transactions["card_id"])
    assert len(shared) > 0.5 * night1.transactions["card_id"].nunique()


def test_dev_and_prod_configs_load_and_bad_values_are_named() -> None:
    for env in ("dev", "prod"):
        cfg = load_simulation_config(env)
        assert cfg.fraud_rate == pytest.approx(0.005)
        parse_rfc3339(f"{cfg.start_date}T00:00:00Z")
    with pytest.raises(ConfigError, match="fraud_rate"):
        dataclasses.replace(SMALL, fraud_rate=0.7)
    with pytest.raises(ConfigError, match="start_date"):
        dataclasses.replace(SMALL, start_date="03/02/2026")
