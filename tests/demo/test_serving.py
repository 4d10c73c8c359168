"""The demo's serving step in parts: which payments it sends, how decisions print, a service that dies.

The whole step (a real ``fraudctl serve`` beside two nights, the hot reload) runs in test_demo.py.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeline.contract import Kind, validate_object
from pipeline.demo.serving import (
    LIVE_FRAUDS,
    LIVE_PAYMENTS,
    LivePayment,
    ServiceFailed,
    ServiceProcess,
    decision_line,
    pick_live_payments,
    serving_summary,
)
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import GENUINE, load_simulation_config, simulate

# One day of a small portfolio with a high fraud rate: every pattern shows up.
DAY = dataclasses.replace(load_simulation_config("dev"), start_date="2026-02-05", days=1, num_cards=800,
                          num_merchants=200, fraud_rate=0.05)


def test_live_payments_are_valid_events_in_time_order_with_frauds_of_distinct_patterns():
    sim = simulate(DAY)
    live = pick_live_payments(sim)
    assert len(live) == LIVE_PAYMENTS
    assert all(validate_object(p.event, Kind.TRANSACTION) is None for p in live)
    times = [p.event["event_time"] for p in live]
    assert times == sorted(times)
    frauds = [p.pattern for p in live if p.is_fraud]
    assert len(frauds) == LIVE_FRAUDS == len(set(frauds))
    truth = dict(zip(sim.truth["transaction_id"], sim.truth["pattern"], strict=True))
    assert all(truth[p.event["transaction_id"]] == p.pattern for p in live)  # the truth shown is the simulator's


def test_a_day_without_fraud_sends_genuine_payments_only():
    sim = simulate(dataclasses.replace(DAY, fraud_rate=0.0))
    live = pick_live_payments(sim)
    assert len(live) == LIVE_PAYMENTS and {p.pattern for p in live} == {GENUINE}


def test_decision_line_shows_truth_score_decision_version_and_reasons():
    payment = LivePayment({"transaction_id": "tx-1", "amount": 507.6, "currency": "USD"}, "compromised_merchant")
    answer = {"transaction_id": "tx-1", "score": 0.9312, "decision": "block", "model_version": 2,
              "reasons": {"decided_by": "score", "rules": [], "thresholds": ["block_threshold>=0.9"],
                          "top_features": [{"feature": "mcc_code", "value": 12.0, "contribution": 0.41}]}}
    line = decision_line(payment, answer)
    assert re.search(r"tx-1 +507\.60 USD +fraud \(compromised_merchant\) +score 0\.931 +block +v2 +by score; "
                     r"top features: mcc_code \+0\.410$", line)


def test_summary_without_a_champion_says_the_service_did_not_start():
    assert serving_summary(None) == ["   scoring service: not started (no champion yet)"]


def test_a_service_that_exits_is_reported_with_its_log(tmp_path, state_dir):
    service = ServiceProcess("no-such-env", KafkaConfig(), tmp_path / "serving.log")
    assert service.url.startswith("http://127.0.0.1:")
    service.start()
    try:
        with pytest.raises(ServiceFailed, match=r"exited with code 1: see .*serving\.log"):
            service.wait_ready(timeout_s=120)
    finally:
        assert service.stop() == 1
    assert "no-such-env" in (tmp_path / "serving.log").read_text()
