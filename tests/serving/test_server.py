"""The service on a real uvicorn, on a free loopback port, under concurrent load while the alias moves."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import httpx
import pytest
import uvicorn

from pipeline.kafka.broker import free_port
from pipeline.registry.aliases import advance_champion
from pipeline.registry.rollback import rollback
from pipeline.registry.store import CHAMPION
from pipeline.serving.server import uvicorn_config
from tests.serving import factory
from tests.serving.conftest import app_of, event
from tests.serving.scrape import value

pytestmark = pytest.mark.slow

CLIENTS = 6
DEADLINE_S = 60.0  # every wait below is bounded by this


@contextmanager
def serving(service) -> Iterator[str]:
    """The service's app on uvicorn in a thread; yields its base URL, stops it on exit."""
    config = replace(service.config.server, host="127.0.0.1", port=free_port())
    server = uvicorn.Server(uvicorn_config(app_of(service), config))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + DEADLINE_S
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://{config.host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(DEADLINE_S)


@dataclass
class Load:
    """CLIENTS threads posting /score in a loop until stopped: every status and version, per client."""

    url: str
    rows: list[dict]
    statuses: list[int] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=lambda: [[] for _ in range(CLIENTS)])
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, client_id: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30.0) as http:
            i = client_id
            while not self.stop.is_set():
                response = http.post("/score", json=self.rows[i % len(self.rows)])
                self.statuses.append(response.status_code)
                if response.status_code == 200:
                    self.versions[client_id].append(response.json()["model_version"])
                i += CLIENTS

    def seen(self, version: int) -> bool:
        return any(v and v[-1] == version for v in self.versions)

    def wait_until(self, condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert condition(), "timed out"


@contextmanager
def under_load(url: str, rows: list[dict]) -> Iterator[Load]:
    load = Load(url, rows)
    threads = [threading.Thread(target=load.run, args=(i,), daemon=True) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        load.wait_until(lambda: len(load.statuses) >= 50)
        yield load
    finally:
        load.stop.set()
        for t in threads:
            t.join(DEADLINE_S)


def test_hot_swap_under_concurrent_load_fails_no_request(serving_config, make_service, config, client, logged,
                                                         champion, window):
    rows = [event(r) for r in window.transactions.head(400).to_dict("records")]
    with serving(make_service(serving_config)) as url, under_load(url, rows) as load:
        new = factory.register(config, logged.other)
        advance_champion(client, config.model_name, new, champion)
        load.wait_until(lambda: all(v and v[-1] == new for v in load.versions))
        after = len(load.statuses)
        load.wait_until(lambda: len(load.statuses) >= after + 50)
    assert load.statuses and set(load.statuses) == {200}
    for versions in load.versions:
        # Atomic swap: each client sees the old version, then only the new one, never a mix after.
        first_new = versions.index(new)
        assert set(versions[:first_new]) == {champion} and set(versions[first_new:]) == {new}


def test_a_failed_load_and_a_rollback_under_load(serving_config, make_service, config, client, logged,
                                                 champion, window):
    rows = [event(r) for r in window.transactions.head(400).to_dict("records")]
    with serving(make_service(serving_config)) as url, under_load(url, rows) as load:
        new = factory.register(config, logged.other)
        advance_champion(client, config.model_name, new, champion)
        load.wait_until(lambda: load.seen(new))
        broken = factory.register(config, logged.stale)  # a bad promotion: another feature schema
        client.set_registered_model_alias(config.model_name, CHAMPION, str(broken))
        with httpx.Client(base_url=url) as http:
            load.wait_until(lambda: (http.get("/health").json()["model"]["last_error"] or {}).get("version") == broken)
            metrics = http.get("/metrics").text
            assert value(metrics, "fraud_scoring_model_load_error", role="champion") == 1
            served = len(load.statuses)
            load.wait_until(lambda: len(load.statuses) >= served + 30)
            assert all(v[-1] == new for v in load.versions)  # the failed version never served
            rollback(config, actor="test", reason="bad promotion")  # champion -> previous champion (the first)
            load.wait_until(lambda: all(v[-1] == champion for v in load.versions))
    assert set(load.statuses) == {200}


def test_oversize_request_over_real_http_keeps_the_connection_usable(http_server_rows):
    url, row, limit = http_server_rows
    with httpx.Client(base_url=url) as http:
        big = http.post("/score", json={**row, "note": "x" * limit})
        assert (big.status_code, big.json()["error"]) == (413, "body_too_large")
        assert http.post("/score", json=row).status_code == 200


@pytest.fixture
def http_server_rows(serving_config, make_service, champion, window) -> Iterator[tuple[str, dict, int]]:
    with serving(make_service(serving_config)) as url:
        yield url, event(window.transactions.iloc[0].to_dict()), serving_config.server.max_body_bytes
