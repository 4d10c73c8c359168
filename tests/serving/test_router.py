"""The partitioned tier: the router's batch split, and two partitions behind the router scoring a
replayed day with the features one process computes, every decision once on the scores topic."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import httpx
import pytest
import uvicorn

from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.serving.config import ScoresConfig, StreamConfig
from pipeline.serving.errors import ServingError
from pipeline.serving.partitioning import Ownership
from pipeline.serving.router import (
    Part,
    Router,
    Upstream,
    _first_refusal,
    discover_layout,
    router_config,
    split_batch,
)
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.service import build_service
from tests.serving import factory
from tests.serving.conftest import event
from tests.serving.test_server import serving

LAYOUT = Ownership(0, 2, 4)
DAY = "2026-03-07"
CHUNK = 40  # payments published, then scored, at a time


def rows_of(frame) -> list[dict]:
    return [event(r) for r in frame.to_dict("records")]


def test_a_batch_is_split_by_owner_and_an_invalid_one_is_not_split(window):
    rows = rows_of(window.transactions.head(30))
    body = json.dumps({"transactions": rows}).encode()
    parts = split_batch(body, LAYOUT)
    assert [p.owner for p in parts] == [0, 1]
    assert sorted(i for p in parts for i in p.positions) == list(range(30))
    for part in parts:
        assert all(LAYOUT.owner(rows[i]["card_id"]) == part.owner for i in part.positions)
        assert [json.loads(item) for item in part.items] == [rows[i] for i in part.positions]
    invalid = json.dumps({"transactions": [*rows[:3], {**rows[3], "amount": -1}]}).encode()
    assert split_batch(invalid, LAYOUT) is None and split_batch(b"{", LAYOUT) is None


def test_a_refused_part_names_the_item_by_its_place_in_the_request():
    failed = [(Part(1, [1, 4, 6], []), 422, b'{"error":"late_event","field":"event_time","detail":"x","index":2}'),
              (Part(0, [0, 3, 5], []), 422, b'{"error":"future_event_time","field":"event_time","detail":"y","index":1}')]
    status, body = _first_refusal(failed)
    assert status == 422 and json.loads(body)["index"] == 3 and json.loads(body)["error"] == "future_event_time"


class RouterThread:
    """The router on uvicorn in a thread (as ``fraudctl route`` runs it), over ``urls``."""

    def __init__(self, urls: list[str]) -> None:
        from threading import Thread

        from pipeline.kafka.broker import free_port
        self.router = Router([Upstream(u.removeprefix("http://")) for u in urls], 16_384, 1_048_576)
        self.port = free_port()
        self.server = uvicorn.Server(router_config(self.router, "127.0.0.1", self.port, 512))
        self.thread = Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.server.started, "the router did not start"
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(60)


def wait_for(condition, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), "timed out"


@pytest.mark.broker
@pytest.mark.slow
def test_two_partitions_behind_the_router_score_a_day_as_one_process_does(
        kafka_config, serving_config, config, window, champion):
    before = window.transactions["event_time"] < DAY
    history = rows_of(window.transactions[before])
    replay = rows_of(window.transactions[~before & (window.transactions["event_time"].str[:10] == DAY)])
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, history).ok
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, rows_of(window.labels)).ok
    topics = {name: f"scores-{name}-{kafka_config.transactions_topic}" for name in ("one", "tier")}

    def service(topic: str, ownership: Ownership | None):
        serving_ = replace(serving_config, stream=StreamConfig(seed_from_raw_store=False, poll_timeout_ms=50),
                           scores=ScoresConfig(topic=topic, create_topic=True))
        return build_service(serving_, config, factory.PARAMS, kafka_config, None, ownership=ownership)

    tier = [service(topics["tier"], Ownership(i, 2, kafka_config.partitions)) for i in range(2)]
    with serving(service(topics["one"], None)) as one, serving(tier[0]) as url0, serving(tier[1]) as url1, \
            RouterThread([url0, url1]) as front:
        processes = (one, url0, url1)
        replay_day(kafka_config, history_records=len(history) + len(window.labels), replay=replay, front=front,
                   one=one, processes=processes)
        wait_for(lambda: [published(one), published(url0) + published(url1)] == [len(replay)] * 2)
        health = [httpx.get(f"{u}/health").json() for u in processes]
        front_health = httpx.get(f"{front}/health").json()
        with pytest.raises(ServingError, match="list them in index order"):  # a router over them swapped
            asyncio.run(discover_layout([Upstream(url1.removeprefix("http://")), Upstream(url0.removeprefix("http://"))]))
    served = {name: [ScoreEvent.from_json(r.value) for r in read_topic(kafka_config, t)] for name, t in topics.items()}
    by_tid = {name: {e.transaction_id: e for e in events} for name, events in served.items()}
    assert len(served["tier"]) == len(by_tid["tier"]) == len(replay)  # every decision, exactly once
    assert by_tid["tier"].keys() == by_tid["one"].keys() == {r["transaction_id"] for r in replay}
    for tid, e in by_tid["tier"].items():
        assert e.features == by_tid["one"][tid].features, tid
        # Scored in batches of another make-up: float32 may differ in the last bits (docs/scoring.md).
        assert e.score == pytest.approx(by_tid["one"][tid].score, rel=1e-5, abs=1e-8), tid
    offline = build_feature_frame(window.transactions, window.labels, factory.PARAMS).set_index("transaction_id")
    for tid, e in by_tid["tier"].items():
        for name in fd.FEATURE_COLUMNS:
            assert e.features[name] == pytest.approx(offline.at[tid, name], rel=1e-9, abs=1e-9), (tid, name)
    assert offline.loc[list(by_tid["tier"]), "merchant_fraud_rate_30d"].gt(0).any()  # the labels mattered
    # One writer per card: the two partitions hold the cards one process holds, split between them.
    cards = [h["features"]["cards"] for h in health]
    assert cards[1] + cards[2] == cards[0] and min(cards[1:]) > 0
    assert [p["status"] for p in front_health["partitions"]] == ["ok", "ok"]
    assert min(p["routed"] for p in front_health["partitions"]) > 0


def published(url: str) -> int:
    return httpx.get(f"{url}/health").json()["scores"]["published"]


def consumed(url: str) -> int:
    return sum(httpx.get(f"{url}/health").json()["stream"]["consumed"].values())


def replay_day(kafka, history_records: int, replay: list[dict], front: str, one: str,
               processes: tuple[str, ...]) -> None:
    """Like a payment switch: each chunk goes to the transactions topic and, once every process has
    it, is scored through the router (batches, and single requests half of them with X-Card-Id) and
    by the one process (batches)."""
    wait_for(lambda: all(consumed(u) == history_records for u in processes))
    with httpx.Client(timeout=30.0) as http:
        for start in range(0, len(replay), CHUNK):
            chunk = replay[start: start + CHUNK]
            assert publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, chunk).ok
            target = history_records + start + len(chunk)
            wait_for(lambda target=target: all(consumed(u) == target for u in processes))
            if (start // CHUNK) % 2 == 0:
                answers = http.post(f"{front}/score/batch", json={"transactions": chunk}).json()["results"]
            else:
                answers = [http.post(f"{front}/score", json=row,
                                     headers={"X-Card-Id": row["card_id"]} if i % 2 else {}).json()
                           for i, row in enumerate(chunk)]
            assert [a["transaction_id"] for a in answers] == [r["transaction_id"] for r in chunk]
            response = http.post(f"{one}/score/batch", json={"transactions": chunk})
            assert response.status_code == 200
