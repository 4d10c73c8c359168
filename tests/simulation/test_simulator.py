"""Simulator output as a whole: contract conformance, fraud rate, labels, determinism, id uniqueness.

Pattern shapes are in test_patterns.py, genuine look-alikes in test_genuine.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from pipeline.config import ConfigError
from pipeline.contract import Kind, parse_rfc3339, validate_event
from pipeline.simulation import GENUINE, PATTERNS, SimulationConfig, load_simulation_config, simulate
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


def test_fraud_rate_follows_config_and_every_pattern_with_a_weight_is_present(sim) -> None:
    counts = sim.pattern_counts()
    assert set(counts) == {GENUINE, *PATTERNS}
    weights = SMALL.pattern_mix.weights()
    assert all(counts[p] > 0 for p in PATTERNS if weights[p] > 0), counts
    assert counts["compromise_window"] == 0 and weights["compromise_window"] == 0
    rate = sim.truth["is_fraud"].mean()
    assert rate == pytest.approx(SMALL.fraud_rate, rel=0.25)
    assert sim.truth["is_fraud"].equals(sim.truth["pattern"] != GENUINE)

    heavy = simulate(dataclasses.replace(SMALL, fraud_rate=0.03, days=2))
    assert heavy.truth["is_fraud"].mean() == pytest.approx(0.03, rel=0.2)
    one_night = simulate(dataclasses.replace(SMALL, fraud_rate=0.03, days=1, start_date="2026-03-20"))
    assert one_night.truth["is_fraud"].mean() == pytest.approx(0.03, rel=0.25)


def test_a_pattern_with_zero_weight_is_absent(sim) -> None:
    mix = dataclasses.replace(SMALL.pattern_mix, low_and_slow=0.0, card_testing=0.0)
    counts = simulate(dataclasses.replace(SMALL, days=2, pattern_mix=mix)).pattern_counts()
    assert counts["low_and_slow"] == 0 and counts["card_testing"] == 0
    assert counts["account_takeover"] > 0


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


def test_amounts_are_positive_unless_zero_amount_card_tests_are_on(sim) -> None:
    assert (sim.transactions["amount"] >= 0.5).all()
    shapes = dataclasses.replace(SMALL.fraud_shapes, zero_amount_card_tests=True)
    zero = simulate(dataclasses.replace(SMALL, days=3, fraud_rate=0.03, fraud_shapes=shapes))
    joined = zero.transactions.merge(zero.truth, on="transaction_id")
    zeros = joined[joined["amount"] == 0.0]
    assert len(zeros) > 0
    assert set(zeros["pattern"]) == {"card_testing"}


def test_labels_refer_to_existing_transactions_after_their_time(sim, frame) -> None:
    labels = sim.labels.merge(frame, on="transaction_id", how="left", suffixes=("", "_truth"))
    assert labels["event_time"].notna().all()
    reported = pd.to_datetime(labels["reported_at"])
    assert (reported >= labels["t"]).all()
    # True fraud is never cleared; clearances come from manual reviews only.
    assert labels.loc[labels["is_fraud_truth"], "is_fraud"].all()
    assert set(labels.loc[~labels["is_fraud"], "source"]) == {"manual_review"}
    assert labels["is_fraud"].any() and (~labels["is_fraud"]).any()
    # Reports take days: most arrive more than a day after the payment, some after the window.
    delay_days = (reported - labels["t"]).dt.total_seconds()[labels["is_fraud"]] / 86400
    assert delay_days.median() > 2.0
    assert (labels["reported_at"] >= "2026-03-09").any()


def test_unreported_share_leaves_fraud_unlabelled() -> None:
    base = dataclasses.replace(SMALL, days=2, cleared_report_rate=0.0, false_report_rate=0.0)
    every = simulate(dataclasses.replace(base, unreported_fraud_share=0.0))
    none = simulate(dataclasses.replace(base, unreported_fraud_share=1.0))
    assert len(every.labels) == int(every.truth["is_fraud"].sum())
    assert len(none.labels) == 0


def test_wrongly_disputed_genuine_payments_are_cleared_later_or_stay_wrong() -> None:
    noisy = simulate(dataclasses.replace(SMALL, days=3, false_report_rate=0.01, false_report_cleared_share=0.5,
                                         cleared_report_rate=0.0, unreported_fraud_share=0.0))
    labels = noisy.labels.merge(noisy.truth, on="transaction_id", suffixes=("", "_truth"))
    genuine = labels[~labels["is_fraud_truth"]]
    disputes = genuine[genuine["is_fraud"]]
    assert len(disputes) == pytest.approx(0.01 * (~noisy.truth["is_fraud"]).sum(), rel=0.2)
    assert set(disputes["source"]) <= {"chargeback", "customer_report"}
    clearances = genuine[~genuine["is_fraud"]].set_index("transaction_id")["reported_at"]
    assert len(clearances) == pytest.approx(0.5 * len(disputes), rel=0.25)
    assert clearances.index.isin(disputes["transaction_id"]).all()  # only disputed payments get cleared
    disputed_at = disputes.set_index("transaction_id")["reported_at"]
    assert (clearances > disputed_at.loc[clearances.index]).all()  # the clearance is the latest report


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
