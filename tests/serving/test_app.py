"""The HTTP app on a real registry: scores, decisions, every class of bad input, health, metrics, admin."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import httpx
import pytest
from fastapi.testclient import TestClient

from models.fraud_mlp import frame_to_tensors
from pipeline.features.frame import build_feature_frame
from pipeline.registry.store import CHAMPION
from tests.serving import factory
from tests.serving.conftest import ADMIN_TOKEN, app_of, event, with_decision
from tests.serving.scrape import samples, value

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def first_rows(window: factory.Window, n: int) -> list[dict]:
    return [event(r) for r in window.transactions.head(n).to_dict("records")]


def test_scores_are_the_champions_probability_of_point_in_time_features(http, window, models, champion):
    rows = first_rows(window, 60)
    answers = [http.post("/score", json=row).json() for row in rows]
    # Independently: the frame builder over the same payments (the service saw no labels) and the
    # trained model on its rows.
    offline = build_feature_frame(window.transactions.head(60), window.labels.head(0), factory.PARAMS)
    numeric, categorical = frame_to_tensors(offline, models.good.config)
    expected = models.good.predict_proba(numeric, categorical).tolist()
    assert [a["transaction_id"] for a in answers] == offline["transaction_id"].tolist()
    assert [a["score"] for a in answers] == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert {a["model_version"] for a in answers} == {champion}
    top = answers[-1]["reasons"]["top_features"]
    assert len(top) == 3 and all(t["feature"] in offline.columns for t in top)
    assert [abs(t["contribution"]) for t in top] == sorted((abs(t["contribution"]) for t in top), reverse=True)


def test_a_lone_request_is_scored_on_the_event_loop_and_concurrent_ones_together(http, window, models):
    rows = first_rows(window, 9)
    one_at_a_time = [http.post("/score", json=row).json() for row in rows[:3]]

    async def at_once() -> list[dict]:  # six requests in one turn of the app's own event loop
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app), base_url="http://app") as client:
            return [r.json() for r in await asyncio.gather(*(client.post("/score", json=row) for row in rows[3:]))]

    together = http.portal.call(at_once)
    text = http.get("/metrics").text
    assert [value(text, f"fraud_scoring_{name}_total") for name in ("batches", "batched_requests", "inline_batches")] \
        == [4, 9, 3]  # three alone, then one batch of six
    offline = build_feature_frame(window.transactions.head(9), window.labels.head(0), factory.PARAMS)
    numeric, categorical = frame_to_tensors(offline, models.good.config)
    expected = models.good.predict_proba(numeric, categorical).tolist()
    answers = one_at_a_time + together
    assert [a["transaction_id"] for a in answers] == offline["transaction_id"].tolist()
    assert [a["score"] for a in answers] == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_thresholds_decide_and_are_reported(serving_config, make_service, window, champion):
    service = make_service(with_decision(serving_config, review_threshold=0.0, block_threshold=0.0,
                                         allowlist_override=1.0))
    with TestClient(app_of(service)) as http:
        answer = http.post("/score", json=first_rows(window, 1)[0]).json()
    assert answer["decision"] == "block"
    assert answer["reasons"]["decided_by"] == "score"
    assert answer["reasons"]["thresholds"] == ["review_threshold>=0", "block_threshold>=0"]


def test_rules_decide_and_refresh_without_restart(serving_config, make_service, window, champion):
    rows = first_rows(window, 3)
    rules_file = serving_config.rules.file()
    # Every payment would be blocked on its score alone; the allowlist lets one card through.
    service = make_service(with_decision(serving_config, review_threshold=0.0, block_threshold=0.0))
    with TestClient(app_of(service)) as http:
        assert http.post("/score", json=rows[0]).json()["decision"] == "block"
        rules_file.write_text(f'[allow]\ncard = ["{rows[1]["card_id"]}"]\n'
                              f'[block]\nmerchant = ["{rows[2]["merchant_id"]}"]\n')
        assert http.post("/admin/rules/refresh", headers=AUTH).status_code == 200
        allowed = http.post("/score", json=rows[1]).json()
        blocked = http.post("/score", json=rows[2]).json()
    assert (allowed["decision"], allowed["reasons"]["decided_by"]) == ("allow", "allowlist")
    assert allowed["reasons"]["rules"] == [f"allowlist:card={rows[1]['card_id']}"]
    assert (blocked["decision"], blocked["reasons"]["decided_by"]) == ("block", "blocklist")


def test_rules_file_is_refreshed_on_its_interval(http, serving_config, window):
    row = first_rows(window, 1)[0]
    serving_config.rules.file().write_text(f'[block]\ndevice = ["{row["device_id"]}"]\n' if "device_id" in row
                                           else f'[block]\ncard = ["{row["card_id"]}"]\n')
    answer = None
    for _ in range(100):  # refresh_interval_s = 0.1: no admin call, no restart
        answer = http.post("/score", json=row).json()
        if answer["decision"] == "block":
            break
        time.sleep(0.05)
    assert answer["reasons"]["decided_by"] == "blocklist"


def _mutated(row: dict, **changes) -> bytes:
    return json.dumps({**row, **changes}).encode()


BAD_INPUTS = {
    "malformed_json": (b'{"schema_version": 1, "transaction_id": ', 400, "malformed_json", None),
    "empty_body": (b"", 400, "malformed_json", None),
    "not_utf8": (b'{"schema_version": 1, "card_id": "\xff"}', 400, "malformed_json", None),
    "deeply_nested": (b"[" * 10_000, 400, "malformed_json", None),
    "lone_surrogate": (None, 400, "malformed_json", "card_id"),
    "not_an_object": (b"[1, 2, 3]", 422, "not_an_object", None),
    "missing_field": (None, 422, "missing_field", "currency"),
    "wrong_type": (None, 422, "wrong_type", "amount"),
    "unknown_schema_version": (None, 422, "unknown_schema_version", "schema_version"),
    "schema_version_as_string": (None, 422, "wrong_type", "schema_version"),
    "negative_amount": (None, 422, "negative_amount", "amount"),
    "non_finite_amount": (None, 422, "non_finite_amount", "amount"),
    "bad_time": (None, 422, "bad_time", "event_time"),
    "empty_id": (None, 422, "empty_id", "card_id"),
}


def _bad_body(case: str, row: dict) -> bytes:
    body = BAD_INPUTS[case][0]
    if body is not None:
        return body
    return {
        "lone_surrogate": _mutated(row).replace(row["card_id"].encode(), b"\\ud800"),
        "missing_field": json.dumps({k: v for k, v in row.items() if k != "currency"}).encode(),
        "wrong_type": _mutated(row, amount="12.50"),
        "unknown_schema_version": _mutated(row, schema_version=2),
        "schema_version_as_string": _mutated(row, schema_version="1"),
        "negative_amount": _mutated(row, amount=-1),
        "non_finite_amount": json.dumps({**row, "amount": float("inf")}).encode(),
        "bad_time": _mutated(row, event_time="2026-02-30T10:00:00Z"),
        "empty_id": _mutated(row, card_id=" "),
    }[case]


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_a_4xx_with_the_contracts_reason(http, window, case):
    row = first_rows(window, 1)[0]
    response = http.post("/score", content=_bad_body(case, row), headers={"content-type": "application/json"})
    _, status, reason, field = BAD_INPUTS[case]
    assert (response.status_code, response.json()["error"], response.json()["field"]) == (status, reason, field)
    assert http.post("/score", json=row).status_code == 200  # and the service carries on


def test_oversize_bodies_are_refused_before_and_while_reading(http, serving_config, window):
    limit = serving_config.server.max_body_bytes
    row = first_rows(window, 1)[0]
    padded = json.dumps({**row, "note": "x" * limit}).encode()
    declared = http.post("/score", content=padded)
    streamed = http.post("/score", content=iter([padded[:1000], padded[1000:]]))  # chunked: no Content-Length
    assert (declared.status_code, declared.json()["error"]) == (413, "body_too_large")
    assert (streamed.status_code, streamed.json()["error"]) == (413, "body_too_large")


def test_batch_scores_in_request_order_with_one_version(http, window, champion):
    rows = first_rows(window, 20)
    single = [r["transaction_id"] for r in rows]
    answer = http.post("/score/batch", json={"transactions": rows[::-1]})
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [r["transaction_id"] for r in results] == single[::-1]
    assert {r["model_version"] for r in results} == {champion}


@pytest.mark.parametrize(("body", "status", "error", "index"), [
    (b'{"transactions": [', 400, "malformed_json", None),
    (b'[{"schema_version": 1}]', 422, "not_an_object", None),
    (b'{"rows": []}', 422, "missing_field", None),
    (b'{"transactions": {}}', 422, "wrong_type", None),
    (None, 422, "missing_field", 1),  # the second item lacks a field
    (None, 413, "batch_too_large", None),
])
def test_bad_batches_are_refused_as_a_whole(http, window, serving_config, body, status, error, index):
    rows = first_rows(window, 2)
    if body is None and status == 422:
        body = json.dumps({"transactions": [rows[0], {k: v for k, v in rows[1].items() if k != "amount"}]}).encode()
    elif body is None:
        body = json.dumps({"transactions": [rows[0]] * (serving_config.server.max_batch_items + 1)}).encode()
    response = http.post("/score/batch", content=body)
    assert (response.status_code, response.json()["error"], response.json().get("index")) == (status, error, index)


def test_health_ready_and_metrics_report_the_live_model(http, window, champion):
    for row in first_rows(window, 5):
        http.post("/score", json=row)
    http.post("/score", content=b"{")
    health = http.get("/health").json()
    assert (health["status"], health["model"]["version"], health["model"]["last_error"]) == ("ok", champion, None)
    assert health["model"]["loaded_at"] > 0
    assert http.get("/ready").status_code == 200
    metrics = http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    assert value(text, "fraud_scoring_http_requests_total", path="/score", method="POST", status="200") == 5
    assert value(text, "fraud_scoring_http_requests_total", path="/score", method="POST", status="400") == 1
    assert value(text, "fraud_scoring_http_request_duration_seconds_count", path="/score") == 6
    assert value(text, "fraud_scoring_model_version", role="champion") == champion
    assert value(text, "fraud_scoring_model_loads_total", role="champion", result="success") == 1
    assert value(text, "fraud_scoring_rules_refreshes_total", result="failure") == 0
    decisions = {labels: n for (name, labels), n in samples(text).items() if name == "fraud_scoring_decisions_total"}
    assert sum(decisions.values()) == 5
    assert all(("version", str(champion)) in labels for labels in decisions)
    assert value(text, "fraud_scoring_rate_window_payments", window="300s") == 5
    # The champion ships no operating points: serving.toml's thresholds, no budget, nothing judged.
    assert (health["degraded"], health["review_rate_check"]["state"]) == ([], "not_judged")
    assert health["rates"]["300s"]["payments"] == 5


def test_not_ready_without_a_champion(serving_config, make_service, window, config):
    with TestClient(app_of(make_service(serving_config))) as http:
        assert http.get("/ready").status_code == 503
        response = http.post("/score", json=first_rows(window, 1)[0])
        health = http.get("/health").json()
    assert (response.status_code, response.json()["error"]) == (503, "not_ready")
    assert health["status"] == "not_ready" and health["model"]["version"] is None


def test_admin_endpoints_need_the_token(http, serving_config, make_service):
    assert http.post("/admin/reload").status_code == 401
    assert http.post("/admin/reload", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert http.post("/admin/reload", headers=AUTH).status_code == 200
    no_token = make_service(replace(serving_config, admin=replace(serving_config.admin, token="")))
    with TestClient(app_of(no_token)) as closed:
        assert closed.post("/admin/rules/refresh", headers=AUTH).status_code == 403


def test_pin_serves_a_version_whatever_the_alias_says(http, config, client, logged, champion, window):
    other = factory.register(config, logged.other)
    stale = factory.register(config, logged.stale)
    assert http.post(f"/admin/pin?version={other}", headers=AUTH).status_code == 200
    assert http.post("/score", json=first_rows(window, 1)[0]).json()["model_version"] == other
    refused = http.post(f"/admin/pin?version={stale}", headers=AUTH)
    assert refused.status_code == 409 and "feature schema" in refused.json()["detail"]
    assert http.post(f"/admin/pin?version={other + 100}", headers=AUTH).status_code == 409
    not_a_number = http.post("/admin/pin?version=latest", headers=AUTH)
    assert (not_a_number.status_code, not_a_number.json()["field"]) == (422, "version")
    assert http.get("/health").json()["model"]["version"] == other  # refused pins changed nothing
    client.set_registered_model_alias(config.model_name, CHAMPION, str(champion))
    assert http.post("/admin/pin", headers=AUTH).json()["model"]["version"] == champion  # unpinned: alias again


def test_openapi_documents_the_contract(http):
    spec = http.get("/openapi.json").json()
    schema = spec["paths"]["/score"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"schema_version", "transaction_id", "event_time", "card_id", "merchant_id", "amount",
            "currency"} == set(schema["required"])
    assert {"/score/batch", "/health", "/ready", "/metrics", "/admin/pin"} <= set(spec["paths"])
    assert http.get("/docs").status_code == 200
