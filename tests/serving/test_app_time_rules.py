"""POST /score and /score/batch apply ingest's timing rules: a payment ingest would quarantine as
late_event or future_event_time gets 422 with that reason, and the features never see it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from pipeline.ingest.config import RawStoreConfig
from pipeline.serving.config import TimeRulesConfig
from pipeline.serving.features import FeatureStore, micros, payment_from_event, payment_time_rules
from pipeline.serving.service import ScoringService
from tests.serving import factory
from tests.serving.conftest import app_of, event

RAW = RawStoreConfig(max_lateness_days=7.0, max_clock_skew_s=300.0)
HOUR_US = 3600 * 1_000_000
DAY_US = 24 * HOUR_US


def _rows(window: factory.Window, n: int) -> list[dict]:
    return [event(r) for r in window.transactions.head(n).to_dict("records")]


def _at(row: dict, ts_us: int, tag: str) -> dict:
    seconds, micro = divmod(ts_us, 1_000_000)
    when = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{micro:06d}Z"
    return {**row, "transaction_id": f"{row['transaction_id']}-{tag}", "event_time": when}


def _with_rules(service: ScoringService, rules: TimeRulesConfig, now_us: int) -> FeatureStore:
    """Give ``service`` a feature store under ``rules`` whose wall clock stands at ``now_us``."""
    store = FeatureStore(factory.PARAMS, service.config.stream.expiry_margin_hours, payment_time_rules(rules, RAW),
                         wall_clock=lambda: now_us / 1e6)
    service.parts.features = store
    return store


def _replayed(rows: list[dict]) -> FeatureStore:
    store = FeatureStore(factory.PARAMS, 24)
    for row in rows:
        store.observe_payment(payment_from_event(row))
    return store


def test_payments_dated_1970_or_9999_are_refused_and_leave_the_features_untouched(
        serving_config, make_service, window, champion):
    rows = _rows(window, 40)
    service = make_service(serving_config)
    store = _with_rules(service, TimeRulesConfig(), micros(rows[-1]["event_time"]) + HOUR_US)
    with TestClient(app_of(service)) as client:
        assert {client.post("/score", json=row).status_code for row in rows[:-1]} == {200}
        before = store.status()
        late = client.post("/score", json={**rows[-1], "event_time": "1970-01-01T00:00:00Z"})
        future = client.post("/score", json={**rows[-1], "event_time": "9999-12-31T23:59:59Z"})
        after = store.status()
    assert (late.status_code, late.json()["error"], late.json()["field"]) == (422, "late_event", "event_time")
    assert (future.status_code, future.json()["error"], future.json()["field"]) == (
        422, "future_event_time", "event_time")
    assert "watermark" in late.json()["detail"] and "index" not in late.json()
    assert after == before  # nothing remembered; the stream's clock (and so expiry) did not move
    probe = payment_from_event(rows[-1])
    assert store.features(probe) == _replayed(rows[:-1]).features(probe)


def test_a_batch_with_one_mistimed_payment_is_refused_whole_with_its_index(
        serving_config, make_service, window, champion):
    rows = _rows(window, 3)
    service = make_service(serving_config)
    latest = max(micros(r["event_time"]) for r in rows)
    store = _with_rules(service, TimeRulesConfig(), latest + HOUR_US)
    # The second is 8 days behind the first of the same batch: late, as ingest judges records in order.
    batch = [rows[0], _at(rows[1], micros(rows[0]["event_time"]) - 8 * DAY_US, "late"), rows[2]]
    with TestClient(app_of(service)) as client:
        refused = client.post("/score/batch", json={"transactions": batch})
        assert store.status()["payments"] == 0
        ahead = client.post("/score/batch", json={"transactions": [rows[0], _at(rows[2], latest + 2 * HOUR_US, "ahead")]})
        accepted = client.post("/score/batch", json={"transactions": rows})
    assert (refused.status_code, refused.json()["error"], refused.json()["index"]) == (422, "late_event", 1)
    assert (ahead.status_code, ahead.json()["error"], ahead.json()["index"]) == (422, "future_event_time", 1)
    assert accepted.status_code == 200 and store.status()["payments"] == 3


@pytest.mark.parametrize(("late_against", "status"), [("clock", 422), ("watermark", 200), ("off", 200)])
def test_config_says_what_late_is_measured_against(serving_config, make_service, window, champion,
                                                   late_against, status):
    row = _rows(window, 1)[0]
    service = make_service(serving_config)  # a fresh store: no watermark yet
    store = _with_rules(service, TimeRulesConfig(late_against=late_against), micros(row["event_time"]) + 8 * DAY_US)
    with TestClient(app_of(service)) as client:
        answer = client.post("/score", json=row)
    assert answer.status_code == status
    assert store.status()["payments"] == (status == 200)
