"""The partitioned tier: the router's batch split; two partitions behind the router scoring a
replayed day with the features one process computes, every decision once on the scores topic; and
partition processes that stall (SIGSTOP) or refuse part of a batch: a 504 naming the partition, a
degraded /health within the deadline, and a split batch that is scored everywhere or nowhere."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import replace

import httpx
import pytest
import uvicorn

from pipeline.config import ConfigError
from pipeline.contract import Kind
from pipeline.features import definitions as fd
from pipeline.features.frame import build_feature_frame
from pipeline.kafka.producer import publish_records
from pipeline.kafka.reader import read_topic
from pipeline.serving.config import ScoresConfig, StreamConfig, load_serving_config
from pipeline.serving.errors import ServingError
from pipeline.serving.partitioning import Ownership
from pipeline.serving.router import (
    Answer,
    Part,
    Router,
    discover_layout,
    first_refusal,
    merge_parts,
    router_config,
    split_batch,
    upstreams_of,
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
    failed = [(Part(1, [1, 4, 6], []), Answer(422, b'{"error":"late_event","field":"event_time","detail":"x","index":2}')),
              (Part(0, [0, 3, 5], []), Answer(422, b'{"error":"future_event_time","field":"event_time","detail":"y",'
                                                   b'"index":1}'))]
    position, status, body = first_refusal(failed)
    assert (position, status, body["index"], body["error"]) == (3, 422, 3, "future_event_time")


def test_a_batch_scored_everywhere_comes_back_in_request_order():
    parts = [Part(0, [0, 2], []), Part(1, [1, 3], [])]
    answers = [Answer(200, b'{"results":[{"t":"a"},{"t":"c"}]}'), Answer(200, b'{"results":[{"t":"b"},{"t":"d"}]}')]
    status, body = merge_parts(parts, answers)
    assert status == 200 and [r["t"] for r in json.loads(body)["results"]] == ["a", "b", "c", "d"]


def test_a_part_that_fails_when_scored_says_which_items_were_scored_and_which_are_unknown():
    """The non-atomic remainder: every part passed the check, then one partition stalled (the
    router's own 504) and another refused a payment its watermark had moved past."""
    parts = [Part(0, [0, 3], []), Part(1, [1, 4], []), Part(2, [2, 5], [])]
    stalled = b'{"error":"upstream_timeout","field":null,"detail":"scoring partition 1 at h:1: no answer",' \
              b'"partition":{"index":1,"address":"h:1"}}'
    answers = [Answer(200, b'{"results":[{"t":"a"},{"t":"d"}]}'), Answer(504, stalled, answered=False),
               Answer(422, b'{"error":"late_event","field":"event_time","detail":"late","index":1}')]
    status, raw = merge_parts(parts, answers)
    body = json.loads(raw)
    assert status == 504 and body["partition"] == {"index": 1, "address": "h:1"}  # the earliest failed item's
    assert body["results"] == [{"t": "a"}, None, None, {"t": "d"}, None, None]
    assert body["unknown"] == [1, 4]  # partition 2 answered its refusal: nothing of its part was scored
    assert "resend only the others" in body["detail"]


def test_the_routers_deadline_comes_from_serving_toml_and_must_be_positive(tmp_path):
    assert {load_serving_config(env).router.upstream_timeout_s for env in ("dev", "prod")} == {5.0}
    bad = tmp_path / "serving.toml"
    bad.write_text("[router]\nupstream_timeout_s = 0\n")
    with pytest.raises(ConfigError, match="router.upstream_timeout_s must be > 0"):
        load_serving_config(path=bad)


class RouterThread:
    """The router on uvicorn in a thread (as ``fraudctl route`` runs it), over ``urls``, each call to a
    partition bounded by ``timeout_s``."""

    def __init__(self, urls: list[str], timeout_s: float = 30.0) -> None:
        from threading import Thread

        from pipeline.kafka.broker import free_port
        self.router = Router(upstreams_of([u.removeprefix("http://") for u in urls], timeout_s), 16_384, 1_048_576)
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


async def layout_of(urls: list[str]):
    upstreams = upstreams_of([u.removeprefix("http://") for u in urls])
    try:
        return await discover_layout(upstreams)
    finally:
        await asyncio.gather(*(u.close() for u in upstreams))


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
            asyncio.run(layout_of([url1, url0]))
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


# -- a tier of real partition processes: stalled (SIGSTOP), and refusing one part of a batch ---------

TIER_TIMEOUT_S = 1.0  # the router's upstream deadline in these tests
SLACK_S = 5.0  # what a loaded 2-core machine may add to the deadline before the answer is out
TOPIC_PARTITIONS = 4
LAYOUT_OF_TIER = Ownership(0, 2, TOPIC_PARTITIONS)  # who owns a card in the tier (Ownership.owner ignores the index)


def serve_partition(model_name: str, index: int, count: int, port: int) -> None:
    """Run scoring partition ``index`` of ``count`` in this process (the tier tests start it with
    ``python -c``): the registry's champion of ``model_name``, no Kafka, ingest's timing rules."""
    import torch

    from pipeline.registry.config import RegistryConfig
    from pipeline.serving.config import ModelConfig, ServerConfig, ServingConfig
    from pipeline.serving.features import PaymentTimeRules
    from pipeline.serving.server import uvicorn_config
    from tests.serving.conftest import app_of

    torch.set_num_threads(1)
    config = ServingConfig(server=ServerConfig(host="127.0.0.1", port=port),
                           model=ModelConfig(poll_interval_s=1.0, warmup_rows=8),
                           stream=StreamConfig(seed_from_raw_store=False, consume=False))
    service = build_service(config, replace(RegistryConfig(), model_name=model_name), factory.PARAMS, None, None,
                            time_rules=PaymentTimeRules(max_lateness_days=7.0, max_clock_skew_s=300.0),
                            ownership=Ownership(index, count, TOPIC_PARTITIONS))
    uvicorn.Server(uvicorn_config(app_of(service), config.server)).run()


@pytest.fixture(scope="module")
def tier(world, logged, tmp_path_factory):
    """Two partition processes of a champion registered for this module; yields their Popen and URLs."""
    import subprocess
    import sys

    from mlflow import MlflowClient

    from pipeline.config import PROJECT_ROOT
    from pipeline.kafka.broker import free_port
    from pipeline.registry.config import RegistryConfig
    from pipeline.registry.store import CHAMPION, connect

    registry = replace(RegistryConfig(), model_name="fd-router-tier")
    version = factory.register(registry, logged.good)
    client: MlflowClient = connect(registry)
    client.set_registered_model_alias(registry.model_name, CHAMPION, str(version))
    logs = tmp_path_factory.mktemp("tier")
    processes, urls = [], []
    try:
        for i in range(2):
            port = free_port()
            code = ("from tests.serving.test_router import serve_partition; "
                    f"serve_partition({registry.model_name!r}, {i}, 2, {port})")
            with open(logs / f"partition-{i}.log", "wb") as log_file:
                processes.append(subprocess.Popen([sys.executable, "-c", code], cwd=PROJECT_ROOT, stdout=log_file,
                                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        for process, url, i in zip(processes, urls, range(2), strict=True):
            wait_for(lambda p=process, u=url: p.poll() is not None or ready(u), timeout_s=180)
            assert process.poll() is None, (logs / f"partition-{i}.log").read_text()[-3000:]
        yield processes, urls
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/ready", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def payments_seen(url: str) -> int:
    """Payments the partition has scored (its features remember every scored payment, and nothing else here)."""
    return httpx.get(f"{url}/health", timeout=30.0).json()["features"]["payments_seen"]


@contextmanager
def stopped(process):
    """The partition process stopped (SIGSTOP) as a stalled one is: connections accepted, nothing answered."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def timed_request(http: httpx.Client, method: str, path: str, **kwargs) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = http.request(method, path, **kwargs)
    return response, time.monotonic() - started


@pytest.mark.slow
def test_a_stopped_partition_is_a_504_naming_it_and_health_degraded_within_the_timeout(tier, window):
    processes, urls = tier
    rows = rows_of(window.transactions.head(60))
    theirs = [r for r in rows if LAYOUT_OF_TIER.owner(r["card_id"]) == 1]
    mine = [r for r in rows if LAYOUT_OF_TIER.owner(r["card_id"]) == 0]
    with RouterThread(urls, timeout_s=TIER_TIMEOUT_S) as front, httpx.Client(base_url=front, timeout=60.0) as http:
        assert http.post("/score", json=theirs[0]).status_code == 200  # a pooled connection to partition 1
        with stopped(processes[1]):
            score, score_s = timed_request(http, "POST", "/score", json=theirs[1])
            health, health_s = timed_request(http, "GET", "/health")
            readiness, ready_s = timed_request(http, "GET", "/ready")
            other = http.post("/score", json=mine[0])  # partition 0 still serves its cards meanwhile
        wait_for(lambda: http.get("/health").json()["status"] == "ok", timeout_s=60)  # and 1 again once resumed
    address = urls[1].removeprefix("http://")
    assert score.status_code == 504 and score.json()["error"] == "upstream_timeout"
    assert score.json()["partition"] == {"index": 1, "address": address}
    assert f"scoring partition 1 at {address}" in score.json()["detail"]
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert [p["status"] for p in health.json()["partitions"]] == ["ok", "timeout"]
    assert any(f"scoring partition 1 at {address}" in problem for problem in health.json()["problems"])
    assert readiness.status_code == 503 and readiness.json()["partitions"] == [200, 504]
    for elapsed in (score_s, health_s, ready_s):
        assert TIER_TIMEOUT_S * 0.9 <= elapsed < TIER_TIMEOUT_S + SLACK_S
    assert other.status_code == 200 and other.json()["transaction_id"] == mine[0]["transaction_id"]


@pytest.mark.slow
def test_a_batch_one_partition_refuses_is_scored_by_none(tier, window):
    """Partition 1 refuses a payment dated in the future (ingest's future_event_time): before the
    check pass, partition 0 had scored (remembered, published) its part of the batch already."""
    _, urls = tier
    rows = rows_of(window.transactions.iloc[100:160])
    owners = [LAYOUT_OF_TIER.owner(r["card_id"]) for r in rows]
    assert set(owners) == {0, 1}
    future = next(i for i in range(len(rows)) if owners[i] == 1 and i > owners.index(0))
    batch = [*rows[:future], {**rows[future], "event_time": "2099-01-01T00:00:00Z"}, *rows[future + 1:]]
    with RouterThread(urls, timeout_s=30.0) as front, httpx.Client(base_url=front, timeout=60.0) as http:
        before = [payments_seen(u) for u in urls]
        refused = http.post("/score/batch", json={"transactions": batch})
        after_refusal = [payments_seen(u) for u in urls]
        scored = http.post("/score/batch", json={"transactions": rows})
        after_scoring = [payments_seen(u) for u in urls]
    assert refused.status_code == 422
    assert (refused.json()["error"], refused.json()["index"]) == ("future_event_time", future)
    assert "results" not in refused.json()  # nothing of it was scored
    assert after_refusal == before  # neither partition scored its part
    assert scored.status_code == 200  # the same batch, on time, is scored whole, in request order
    assert [r["transaction_id"] for r in scored.json()["results"]] == [r["transaction_id"] for r in rows]
    assert [a - b for a, b in zip(after_scoring, after_refusal, strict=True)] == [owners.count(0), owners.count(1)]


@pytest.mark.slow
def test_a_batch_across_a_stopped_partition_is_a_504_and_scored_by_none(tier, window):
    processes, urls = tier
    rows = rows_of(window.transactions.iloc[200:240])
    with RouterThread(urls, timeout_s=TIER_TIMEOUT_S) as front, httpx.Client(base_url=front, timeout=60.0) as http:
        before = payments_seen(urls[0])
        with stopped(processes[1]):
            answer, elapsed = timed_request(http, "POST", "/score/batch", json={"transactions": rows})
        after = payments_seen(urls[0])
    assert answer.status_code == 504 and answer.json()["partition"]["index"] == 1
    assert "results" not in answer.json()  # the check pass timed out: nothing was scored anywhere
    assert after == before
    assert elapsed < TIER_TIMEOUT_S + SLACK_S
