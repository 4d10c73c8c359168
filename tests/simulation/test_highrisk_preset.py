"""The ``highrisk`` preset: a high fraud rate that moves week to week, fraud concentrated in per-card
compromise windows of a few days with shifts in hour, category and amount, look-alike genuine
episodes, noisy and late labels. Every figure is read from a small simulated sample."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from pipeline.simulation import load_simulation_config, simulate
from pipeline.simulation.config import config_fingerprint

PRESET = load_simulation_config("dev", "highrisk")
# Six calendar weeks (Monday to Sunday) of a small card base: ~190k payments in ~3 s.
SAMPLE = dataclasses.replace(PRESET, start_date="2026-01-05", days=42, num_cards=3000, num_merchants=500)


def _frame(config) -> pd.DataFrame:
    sim = simulate(config)
    df = sim.transactions.merge(sim.truth, on="transaction_id", validate="one_to_one")
    df["t"] = pd.to_datetime(df["event_time"])
    df["day"] = df["t"].dt.floor("D")
    df["week"] = (df["day"] - pd.Timestamp("2026-01-05", tz="UTC")).dt.days // 7
    df["hour"] = df["t"].dt.hour + df["t"].dt.minute / 60
    return df


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return _frame(SAMPLE)


@pytest.fixture(scope="module")
def windows(frame) -> pd.DataFrame:
    """Per card hit by ``compromise_window``: its first and last fraud day of that pattern."""
    fraud = frame[frame["pattern"] == "compromise_window"]
    return fraud.groupby("card_id")["day"].agg(first="min", last="max", days="nunique")


def _weekly_fraud_rate(frame: pd.DataFrame) -> pd.Series:
    return frame.groupby("week")["is_fraud"].mean()


def _usual_hour(payments: pd.DataFrame) -> pd.Series:
    """Per card, the circular mean hour of ``payments`` (23:00 and 01:00 average to midnight)."""
    angle = payments["hour"] * 2 * np.pi / 24
    mean = pd.DataFrame({"sin": np.sin(angle), "cos": np.cos(angle), "card_id": payments["card_id"]}
                        ).groupby("card_id").mean()
    return np.mod(np.arctan2(mean["sin"], mean["cos"]) * 24 / (2 * np.pi), 24)


def _hours_from_usual(rows: pd.DataFrame, usual: pd.Series) -> pd.Series:
    gap = (rows["hour"] - rows["card_id"].map(usual)).abs()
    return np.minimum(gap, 24 - gap)


def test_the_preset_is_a_third_portfolio_and_the_first_two_keep_their_ids() -> None:
    default, ecommerce = load_simulation_config("dev"), load_simulation_config("dev", "ecommerce")
    assert PRESET.seed not in (default.seed, ecommerce.seed)
    assert PRESET.fraud_rate > 5 * max(default.fraud_rate, ecommerce.fraud_rate)
    assert PRESET.pattern_mix.compromise_window > 0 == default.pattern_mix.compromise_window
    # The fingerprints (part of every transaction id) the two presets had before the settings they
    # leave at their defaults existed.
    assert (config_fingerprint(default), config_fingerprint(ecommerce)) == ("28e453", "ffba0e")
    assert config_fingerprint(dataclasses.replace(
        default, drift=dataclasses.replace(default.drift, fraud_rate_amplitude=0.1))) != "28e453"


def test_fraud_is_three_to_six_percent_of_payments(frame) -> None:
    assert 0.03 <= frame["is_fraud"].mean() <= 0.06
    weekly = _weekly_fraud_rate(frame)
    assert len(weekly) == 6
    assert weekly.between(0.025, 0.07).all(), weekly


def test_the_fraud_rate_moves_from_week_to_week(frame) -> None:
    weekly = _weekly_fraud_rate(frame)
    assert weekly.max() / weekly.min() > 1.4, weekly
    # Far beyond what the clustering of fraud into incidents gives a flat rate over the same weeks.
    flat = dataclasses.replace(SAMPLE, drift=dataclasses.replace(SAMPLE.drift, fraud_rate_amplitude=0.0))
    flat_weekly = _weekly_fraud_rate(_frame(flat))
    assert weekly.std() / weekly.mean() > 2.5 * flat_weekly.std() / flat_weekly.mean()


def test_fraud_is_concentrated_in_per_card_windows_of_a_few_days(frame, windows) -> None:
    fraud = frame[frame["is_fraud"]]
    assert (fraud["pattern"] == "compromise_window").mean() > 0.6
    span_days = (windows["last"] - windows["first"]).dt.days
    assert span_days.between(1, 4).all()  # 2 to 5 calendar days...
    assert (windows["days"] == span_days + 1).all()  # ...each with fraud: one window per card
    assert len(windows) > 300
    cards = frame[frame["card_id"].isin(windows.index)].join(windows, on="card_id")
    inside = (cards["day"] >= cards["first"]) & (cards["day"] <= cards["last"])
    assert cards.loc[inside, "is_fraud"].mean() > 0.4
    assert cards.loc[~inside, "is_fraud"].mean() < 0.03  # only another pattern's rare hit


def test_hour_category_and_amount_shift_inside_the_window(frame, windows) -> None:
    genuine = frame[~frame["is_fraud"]]
    victims_genuine = genuine[genuine["card_id"].isin(windows.index)]
    fraud = frame[frame["pattern"] == "compromise_window"]
    usual_hour = _usual_hour(genuine)
    assert _hours_from_usual(fraud, usual_hour).median() > 5.0
    assert _hours_from_usual(victims_genuine, usual_hour).median() < 3.0  # the holder keeps his hours

    fraud_mcc = fraud["mcc"].value_counts(normalize=True)
    holder_mcc = victims_genuine["mcc"].value_counts(normalize=True)
    assert 0.5 * fraud_mcc.sub(holder_mcc, fill_value=0).abs().sum() > 0.5  # total variation distance

    usual_amount = genuine.groupby("card_id")["amount"].median()
    assert (fraud["amount"] / fraud["card_id"].map(usual_amount)).median() > 2.5
    # Amounts grow through the window.
    nth_day = (fraud["day"] - fraud["card_id"].map(windows["first"])).dt.days
    ratio = fraud["amount"] / fraud["card_id"].map(usual_amount)
    assert ratio[nth_day >= 2].median() > 1.2 * ratio[nth_day == 0].median()


def test_genuine_episodes_shift_the_same_way(frame) -> None:
    def shifted_genuine(df: pd.DataFrame) -> int:
        genuine = df[~df["is_fraud"]]
        usual_hour = _usual_hour(genuine)
        usual_amount = genuine.groupby("card_id")["amount"].median()
        return int(((_hours_from_usual(genuine, usual_hour) > 5)
                    & (genuine["amount"] > 2 * genuine["card_id"].map(usual_amount))).sum())

    calm = dataclasses.replace(SAMPLE, population=dataclasses.replace(SAMPLE.population, episode_rate=0.0))
    assert shifted_genuine(frame) > 1.4 * shifted_genuine(_frame(calm))


def test_labels_are_noisy_and_late() -> None:
    sim = simulate(dataclasses.replace(SAMPLE, days=14))
    labels = sim.labels.merge(sim.truth, on="transaction_id", suffixes=("", "_truth"))
    frauds = int(sim.truth["is_fraud"].sum())
    reported = labels.loc[labels["is_fraud_truth"], "transaction_id"].nunique()
    assert reported / frauds == pytest.approx(1 - PRESET.unreported_fraud_share, abs=0.05)
    assert (labels["is_fraud"] & ~labels["is_fraud_truth"]).sum() > 50  # wrongful disputes
    times = sim.transactions.set_index("transaction_id")["event_time"]
    delay = pd.to_datetime(labels["reported_at"]) - pd.to_datetime(labels["transaction_id"].map(times))
    assert delay[labels["is_fraud"]].dt.total_seconds().median() > 3 * 86400
