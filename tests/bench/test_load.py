"""The closed-loop client against a small keep-alive HTTP server in a thread: what it counts."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.bench import load


class FakeScorer(BaseHTTPRequestHandler):
    """Answers /score like our service (``model_version`` = ``server.version``), 500 to a body with
    ``fail``, and like mlflow serve (predictions only) to a body with ``mlflow``."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects

    def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
        event = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if event.get("fail"):
            status, answer = 500, {"detail": "boom"}
        elif event.get("mlflow"):
            status, answer = 200, {"predictions": [0.1]}
        else:
            status, answer = 200, {"transaction_id": event["transaction_id"],
                                   "model_version": self.server.version,
                                   "reasons": {"top_features": ["amount"] if event.get("explain") else []}}
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeScorer)
    httpd.daemon_threads = True
    httpd.version = 1
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _bodies(events: list[dict]) -> list[bytes]:
    return [json.dumps({"transaction_id": f"t{i}", **e}).encode() for i, e in enumerate(events)]


def test_closed_loop_sends_each_body_once_and_counts_errors_versions_and_explanations(server):
    bodies = _bodies([{}] * 6 + [{"explain": True}] * 3 + [{"fail": True}] * 2 + [{"mlflow": True}])
    result = load.closed_loop("127.0.0.1", server.server_port, "/score", bodies, concurrency=3)
    assert result["requests"] == 12 and result["errors"] == 2
    assert result["versions"] == {1: 9}  # the failures and mlflow's answer name no version
    assert result["explained"] == 3
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["rps"] > 0


def test_closed_loop_starts_over_while_more_says_so(server):
    def swap_after(done: int) -> None:
        if done == 4:
            server.version = 2

    result = load.closed_loop("127.0.0.1", server.server_port, "/score", _bodies([{}] * 10), concurrency=2,
                              on_progress=swap_after, more=lambda versions: versions[2] < 15, max_factor=20)
    assert 15 <= result["versions"][2] < 15 + 2  # stops once v2 has answered enough (two in flight at most)
    assert result["requests"] == sum(result["versions"].values()) > 10


def test_closed_loop_gives_up_at_max_factor_times_the_bodies(server):
    result = load.closed_loop("127.0.0.1", server.server_port, "/score", _bodies([{}] * 5), concurrency=2,
                              more=lambda _: True, max_factor=3)
    assert result["requests"] == 15 and result["errors"] == 0


def test_open_loop_sends_each_body_at_its_rate_and_counts_errors(server):
    bodies = _bodies([{}] * 37 + [{"fail": True}] * 3)
    result = load.open_loop("127.0.0.1", server.server_port, "/score", bodies, rate=200.0, keep_samples=True)
    assert result["requests"] == 40 and result["errors"] == 3 and result["error_statuses"] == {"500": 3}
    assert not result["gave_up"] and 1 <= result["connections"] <= 40
    assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["p99_9_ms"]
    assert result["achieved_rps"] <= 200.0 * 1.1  # paced, not as fast as the server answers
    due = [s[0] for s in result["samples"]]
    assert len(due) == 40 and sorted(due) == pytest.approx([i / 200.0 for i in range(40)])
    assert sorted(s[2] for s in result["samples"]) == [200] * 37 + [500] * 3
