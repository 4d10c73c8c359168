"""``fraudctl bench partitions``: two scoring partitions behind ``fraudctl route`` against one process.

The serving benchmarks' set-up (:mod:`.served_history`: embedded broker, a simulated history on the
topics, a model of the production architecture as champion), then the same next-day payments, one
per request over ``CONCURRENCY`` keep-alive connections (:func:`.load.closed_loop`), sent

* to one ``fraudctl serve`` (``one``), and
* to ``fraudctl route`` in front of ``fraudctl serve --partition 0/2`` and ``1/2`` (``two_partitions``),

each after the same unmeasured warm-up, every server a process of its own on conf/dev. Fields:
``requests``, ``p50_ms``, ``p99_ms``, ``rps``, ``errors`` per run; ``rps_ratio`` (two / one);
``routed`` (requests the router sent to each partition); ``cpus`` (what the runs shared, client
included). A partition does the work of one process for half the cards plus the merchant state of
the whole stream, and the router adds a hop: on a machine with fewer cores than processes the
ratio measures that overhead, not the scaling (read it against ``cpus``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import torch

from pipeline.bench import load
from pipeline.bench.served_history import (
    CONCURRENCY,
    START_TIMEOUT_S,
    WARMUP_REQUESTS,
    publish_history,
    ready_when,
    records,
    register_model,
    service_workspace,
    set_champion,
    train_model,
)
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.registry.config import RegistryConfig
from pipeline.serving.process import FRAUDCTL, HOST, ServerProcess

REQUESTS = {False: 3000, True: 400}
CARDS = {False: 4000, True: 1200}


def run(quick: bool) -> dict[str, Any]:
    with service_workspace("bench-partitions-") as (work, env, broker):
        return _run(work, env, broker, quick)


def _prepare(broker: EmbeddedBroker, work: Path, quick: bool) -> tuple[list[bytes], int, int]:
    """History on the topics, a champion registered; the next day's request bodies, the champion's
    version and the number of records a ready service has consumed."""
    served = publish_history(broker, CARDS[quick])
    registry = RegistryConfig()
    torch.set_num_threads(1)
    version = register_model(registry, train_model(served.history_features, seed=0), work)
    set_champion(registry, version)
    bodies = [json.dumps(r).encode() for r in records(served.today.head(WARMUP_REQUESTS + REQUESTS[quick]))]
    return bodies, version, served.consumed


def _measure(port: int, bodies: list[bytes]) -> dict[str, Any]:
    load.closed_loop(HOST, port, "/score", bodies[:WARMUP_REQUESTS], CONCURRENCY)
    result = load.closed_loop(HOST, port, "/score", bodies[WARMUP_REQUESTS:], CONCURRENCY)
    return {k: result[k] for k in ("requests", "p50_ms", "p99_ms", "rps", "errors")}


def _run(work: Path, env: dict[str, str], broker: EmbeddedBroker, quick: bool) -> dict[str, Any]:
    bodies, version, consumed = _prepare(broker, work, quick)
    ready = ready_when(version, consumed)
    with ServerProcess.fraudctl_serve(env, work / "one.log") as one:
        one.wait_until("/health", ready, START_TIMEOUT_S)
        alone = _measure(one.port, bodies)
    partitions = [ServerProcess.fraudctl_serve(env, work / f"partition-{i}.log", options=["--partition", f"{i}/2"])
                  for i in range(2)]
    port = free_port()
    router = ServerProcess([sys.executable, "-c", FRAUDCTL, "route", "--partitions",
                            ",".join(f"{HOST}:{p.port}" for p in partitions), "--host", HOST, "--port", str(port)],
                           env, work / "router.log", port)
    with partitions[0], partitions[1]:
        for partition in partitions:
            partition.wait_until("/health", ready, START_TIMEOUT_S)
        with router:
            router.wait_until("/ready", timeout_s=START_TIMEOUT_S)
            tier = _measure(router.port, bodies)
            routed = [p["routed"] for p in httpx.get(f"{router.url}/health").json()["partitions"]]
    return {"concurrency": CONCURRENCY, "cpus": os.cpu_count(), "one": alone, "two_partitions": tier,
            "rps_ratio": round(tier["rps"] / alone["rps"], 3), "routed": routed,
            "goal": "rps_ratio > 1 where the cores outnumber the processes; errors == 0"}
