"""The decisions bench's degradations do what they say: each touches the rows, the days and the
values it names and nothing else. On a small simulated window laid out as a bench portfolio's end:
the live week, then time for its reports to arrive."""

from __future__ import annotations

import dataclasses
from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest

from pipeline.bench.dataset import portfolio_simulation
from pipeline.bench.degradations import (
    FAULTY_ACQUIRER,
    MINOR_UNITS,
    NUM_ACQUIRERS,
    LiveWeek,
    absent_pattern,
    acquirer_minor_units,
    acquirer_of,
    channel_outage,
    event_days,
    new_fraud_pattern,
    only_pattern,
    onset,
    recomputed,
    served_rows,
    utc_start,
    withheld_pattern,
)
from pipeline.features import definitions as fd
from pipeline.features.params import FeatureParams
from pipeline.simulation import load_simulation_config
from pipeline.simulation.simulator import simulate

START = date(2026, 1, 1)
LIVE = (date(2026, 1, 8), date(2026, 1, 14))
DAYS = 28  # a week of history, the live week, a fortnight for its reports (few incidents here, all late)


@pytest.fixture(scope="module")
def week() -> LiveWeek:
    config = dataclasses.replace(load_simulation_config("dev"), start_date=START.isoformat(), days=DAYS,
                                 num_cards=600, num_merchants=150)
    sim = simulate(config)
    cutoff = utc_start(START + timedelta(days=DAYS))
    reports = sim.labels[pd.to_datetime(sim.labels["reported_at"], utc=True, format="ISO8601") < cutoff]
    days = event_days(sim.transactions["event_time"])
    live = sim.transactions[(days >= LIVE[0]) & (days <= LIVE[1])]
    served = served_rows(sim.transactions, reports, FeatureParams(), pd.Index(live["transaction_id"]))
    frauds = set(reports.loc[reports["is_fraud"].astype(bool), "transaction_id"])
    served["label"] = served["transaction_id"].isin(frauds).astype(int)
    return LiveWeek(served, sim.transactions, reports, sim.truth, config, cutoff, FeatureParams())


def _days(frame: pd.DataFrame) -> np.ndarray:
    return event_days(frame["event_time"])


def test_the_live_week_recomputed_without_a_fault_is_the_week_as_served(week):
    control = recomputed(week, week.transactions, week.reports)
    assert list(control["transaction_id"]) == list(week.served["transaction_id"])
    for name in (*fd.FEATURE_COLUMNS, "label"):
        np.testing.assert_array_equal(control[name].to_numpy(), week.served[name].to_numpy(), err_msg=name)


def test_the_outage_sticks_one_feature_for_one_channel_of_about_30_percent_from_the_onset_only(week):
    d = channel_outage(week, "card_amount_zscore_30d", 0.0)
    channel = d.detail["channel"]
    raw = week.served["transaction_id"].map(week.transactions.set_index("transaction_id")["channel"]).to_numpy()
    from_onset = _days(d.frame) >= d.first_affected_day
    assert d.first_affected_day == onset(week.days) == week.days[2]
    np.testing.assert_array_equal(d.affected, (raw == channel) & from_onset)  # that channel, those days, all of it
    assert 0.2 < d.affected[from_onset].mean() < 0.4 and d.detail["channel_share"] == pytest.approx((raw == channel).mean())
    assert (d.frame.loc[d.affected, "card_amount_zscore_30d"] == 0.0).all()
    untouched = d.frame.loc[~d.affected]
    pd.testing.assert_frame_equal(untouched, week.served.loc[~d.affected])
    other = [c for c in d.frame.columns if c != "card_amount_zscore_30d"]
    pd.testing.assert_frame_equal(d.frame[other], week.served[other])  # no other feature moved
    assert week.served.loc[d.affected, "card_amount_zscore_30d"].nunique() > 10  # it varied before


def test_minor_units_multiply_one_acquirers_amounts_from_the_onset_and_carry_into_card_history(week):
    d = acquirer_minor_units(week)
    served = week.served.set_index("transaction_id")
    frame = d.frame.set_index("transaction_id")
    merchant = week.transactions.set_index("transaction_id")["merchant_id"]
    at_acquirer = acquirer_of(merchant.loc[frame.index].to_numpy()) == FAULTY_ACQUIRER
    from_onset = _days(d.frame) >= d.first_affected_day
    np.testing.assert_array_equal(d.affected, at_acquirer & from_onset)
    assert 0.5 / NUM_ACQUIRERS < d.affected[from_onset].mean() < 2.0 / NUM_ACQUIRERS
    np.testing.assert_allclose(frame.loc[d.affected, "amount"], served.loc[d.affected, "amount"] * MINOR_UNITS)
    np.testing.assert_array_equal(frame.loc[~d.affected, "amount"], served.loc[~d.affected, "amount"])
    before = ~from_onset  # the days before the onset are served as they were, every feature
    pd.testing.assert_frame_equal(frame.loc[before, list(fd.FEATURE_COLUMNS)], served.loc[before, list(fd.FEATURE_COLUMNS)])
    later = ~d.affected & from_onset  # other merchants' payments by the same cards see the wrong history
    assert (frame.loc[later, fd.card_mean(30)] != served.loc[later, fd.card_mean(30)]).any()
    np.testing.assert_array_equal(d.frame["label"], week.served["label"])


def test_a_new_pattern_adds_only_its_own_payments_from_the_onset_and_labels_them_by_their_reports(week):
    pattern = absent_pattern(week.config)
    assert pattern is not None and pattern not in set(week.truth["pattern"])  # absent from the base window
    d = new_fraud_pattern(week)
    assert d is not None and d.detail["pattern"] == pattern
    new = ~d.frame["transaction_id"].isin(set(week.served["transaction_id"])).to_numpy()
    np.testing.assert_array_equal(d.affected, new)  # the affected rows are exactly the added ones
    assert new.sum() > 0 and (_days(d.frame)[new] >= d.first_affected_day).all()
    assert (d.frame.loc[new, "pattern"] == pattern).all()
    reported = d.frame.loc[new, "transaction_id"].isin(_reported_fraud(d.frame.loc[new, "transaction_id"], week))
    np.testing.assert_array_equal(d.frame.loc[new, "label"], reported.astype(int))  # labelled as any holdout
    assert 0 < reported.sum() < new.sum()  # reported ones are frauds, unreported ones stay 0
    old = d.frame.loc[~new].set_index("transaction_id").loc[week.served["transaction_id"]]
    np.testing.assert_array_equal(old["label"], week.served["label"])
    before = (_days(week.served) < d.first_affected_day)
    np.testing.assert_array_equal(old.loc[before, list(fd.FEATURE_COLUMNS)].to_numpy(),
                                  week.served.loc[before, list(fd.FEATURE_COLUMNS)].to_numpy())


def _reported_fraud(ids: pd.Series, week: LiveWeek) -> set[str]:
    """Of ``ids`` (new payments), those the simulator's reports call fraud before the labels' cutoff."""
    start, end = onset(week.days), week.days[-1]
    config = dataclasses.replace(week.config, start_date=start.isoformat(), days=(end - start).days + 1)
    labels = simulate(only_pattern(config, "compromise_window")).labels
    made = pd.to_datetime(labels["reported_at"], utc=True, format="ISO8601") < week.labels_cutoff
    return set(labels.loc[made & labels["is_fraud"].astype(bool) & labels["transaction_id"].isin(set(ids)),
                          "transaction_id"])


def test_a_preset_with_every_pattern_has_no_new_one():
    every = load_simulation_config("dev", "highrisk")
    assert absent_pattern(every) is None
    assert absent_pattern(load_simulation_config("dev")) == "compromise_window"


def test_a_preset_with_every_pattern_withholds_its_smallest_and_that_portfolio_never_simulates_it():
    every = load_simulation_config("dev", "highrisk")
    weights = every.pattern_mix.weights()
    pattern = withheld_pattern(every)
    assert weights[pattern] == min(weights.values()) > 0
    without = portfolio_simulation("highrisk", pattern)
    assert absent_pattern(without) == pattern  # so the bench's new-pattern fault injects exactly it
    assert {p: w for p, w in without.pattern_mix.weights().items() if p != pattern} == {
        p: w for p, w in weights.items() if p != pattern}
    assert dataclasses.replace(without, pattern_mix=every.pattern_mix) == every  # nothing else changed
    sim = simulate(dataclasses.replace(without, days=14, num_cards=600, num_merchants=150))
    assert pattern not in set(sim.truth["pattern"]) and sim.truth["pattern"].ne("genuine").any()
