"""The demo's serving step in parts: which payments it sends, how decisions print, a service that dies.

The whole step (a real ``fraudctl serve`` beside two nights, the hot reload) runs in test_demo.py.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pipeline.contract import Kind, validate_object
from pipeline.demo.dirty import publish_raw
from pipeline.demo.scores_log import replay_scores, save_scores
from pipeline.demo.serving import (
    LIVE_FRAUDS,
    LIVE_PAYMENTS,
    LivePayment,
    ServingFigures,
    decision_line,
    pick_live_payments,
    reload_timing,
    service_process,
    serving_summary,
)
from pipeline.kafka.reader import read_topic
from pipeline.kafka.settings import KafkaConfig
from pipeline.serving.config import ADMIN_TOKEN_ENV
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


def test_the_demo_service_runs_the_conf_env_on_the_demo_broker_with_admin_off(tmp_path):
    service = service_process("dev", KafkaConfig(bootstrap_servers="127.0.0.1:19092"), tmp_path / "serving.log")
    assert service.url == f"http://127.0.0.1:{service.port}" and service.process is None
    assert service.command[service.command.index("--env") + 1] == "dev"
    assert service.environment["KAFKA_BOOTSTRAP_SERVERS"] == "127.0.0.1:19092"
    assert service.environment[ADMIN_TOKEN_ENV] == ""


def _figures(**changes) -> ServingFigures:
    base = ServingFigures(day="2026-02-05", requests=4000, decisions={"allow": 3978, "review": 17, "block": 5},
                          day_frauds=30, day_frauds_stopped=12, day_frauds_reported=14, day_frauds_reported_stopped=9,
                          frauds_sent=3, frauds_stopped=1, version=2,
                          operating_points="review >= 0.0213 (budget: top 0.50% of payments), block >= 0.41",
                          review_budget=0.005, reload="serving champion v2", log=Path("serving.log"))
    return dataclasses.replace(base, **changes)


def test_summary_shows_the_flagged_share_beside_the_budget_and_the_frauds_stopped():
    lines = serving_summary(_figures())
    assert lines[0] == ("   scoring service: 4000 live payments of 2026-02-05 scored by v2 (3978 allow, 5 block, "
                        "17 review): 0.55% sent to review or blocked against a review budget of 0.50%")
    assert lines[1] == "   operating points of v2: review >= 0.0213 (budget: top 0.50% of payments), block >= 0.41"
    assert lines[2] == ("   frauds: 12 of the day's 30 frauds sent to review or blocked (9 of the 14 reported within "
                        "the label maturity); 1 of the 3 frauds shown")


def test_summary_of_a_version_served_with_explicit_thresholds_says_there_is_no_budget():
    assert serving_summary(_figures(review_budget=None))[0].endswith("sent to review or blocked (explicit thresholds: no budget)")


def test_the_scores_log_replays_a_topic_byte_for_byte_in_order(kafka_config, tmp_path):
    topic = f"scores-log-{tmp_path.name}"[:200]
    sent = [(f"tx-{i}".encode(), f'{{"i": {i}}}'.encode()) for i in range(50)] + [(b"tx-none", None)]
    assert replay_scores(kafka_config, topic, tmp_path / "absent.jsonl") == 0  # creates the topic
    publish_raw(kafka_config, topic, sent)
    assert save_scores(kafka_config, topic, tmp_path / "scores.jsonl") == len(sent)
    copy = f"{topic}-replayed"
    assert replay_scores(kafka_config, copy, tmp_path / "scores.jsonl") == len(sent)
    original, replayed = read_topic(kafka_config, topic), read_topic(kafka_config, copy)
    assert [(r.partition, r.offset, r.key, r.value) for r in replayed] == \
        [(r.partition, r.offset, r.key, r.value) for r in original]


def test_the_reload_is_timed_from_the_gate_s_record_and_a_load_before_it_says_so_instead_of_zero():
    assert reload_timing(1_000.7, 1_000.0) == "live 0.7s after the gate's decision"
    # The gate moves the alias, then writes its record: a poll in between loads the version first.
    assert reload_timing(1_000.0, 1_000.4) == ("live before the gate had finished recording its decision "
                                               "(it moves the alias, then records)")
