"""The router's partition client: a deadline on every call, and failures that name the partition."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from pipeline.kafka.broker import free_port
from pipeline.serving.upstream import Upstream, UpstreamTimeout, UpstreamUnavailable

TIMEOUT_S = 0.5


async def call(upstream: Upstream, method: str = "POST") -> tuple[int, bytes]:
    try:
        return await upstream.request(method, "/score", b'{"card_id": "c-1"}')
    finally:
        await upstream.close()


def test_a_partition_that_accepts_but_never_answers_is_a_timeout_naming_it():
    # The kernel completes the handshake for a listening socket nobody accepts from, as it does for
    # a SIGSTOPped partition: only a deadline on the read ends the call.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout) as caught:
            asyncio.run(call(Upstream(3, address, TIMEOUT_S)))
        elapsed = time.monotonic() - started
    assert TIMEOUT_S * 0.9 <= elapsed < TIMEOUT_S + 5.0
    assert caught.value.status == 504
    assert caught.value.body()["partition"] == {"index": 3, "address": address}
    assert "scoring partition 3 at " + address in caught.value.body()["detail"]
    assert "scores topic" in caught.value.body()["detail"]  # a POST's outcome is unknown: says where to look


def test_a_partition_that_is_not_listening_is_unavailable_naming_it():
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(UpstreamUnavailable) as caught:
        asyncio.run(call(Upstream(1, address, TIMEOUT_S), method="GET"))
    assert caught.value.status == 502
    assert caught.value.body()["error"] == "upstream_unavailable"
    assert caught.value.body()["partition"] == {"index": 1, "address": address}
