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

The hop itself, ``router_hop``: ``cpu_us_per_request``, the router process's CPU time (user +
system) over the measured tier run divided by its requests, which other load on the machine barely
moves; and one request at a time (:func:`.load.sequential`), partition 0's cards sent straight to
partition 0 (``direct_p50_ms``) and through the router (``routed_p50_ms``), in alternating blocks so
that both see the same machine, and ``added_p50_ms``, their difference.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
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
from pipeline.serving.partitioning import Ownership
from pipeline.serving.process import FRAUDCTL, HOST, ServerProcess

REQUESTS = {False: 3000, True: 400}
CARDS = {False: 4000, True: 1200}
HOP_REQUESTS = {False: 800, True: 200}  # per path (direct, routed), one at a time
HOP_BLOCKS = 4  # direct and routed alternate this many times, so that both see the same load


def run(quick: bool) -> dict[str, Any]:
    with service_workspace("bench-partitions-") as (work, env, broker):
        return _run(work, env, broker, quick)


def _prepare(broker: EmbeddedBroker, work: Path, quick: bool) -> tuple[list[dict[str, Any]], int, int]:
    """History on the topics, a champion registered; the next day's payments, the champion's version
    and the number of records a ready service has consumed."""
    served = publish_history(broker, CARDS[quick])
    registry = RegistryConfig()
    torch.set_num_threads(1)
    version = register_model(registry, train_model(served.history_features, seed=0), work)
    set_champion(registry, version)
    return records(served.today), version, served.consumed


def _measure(port: int, bodies: list[bytes]) -> dict[str, Any]:
    load.closed_loop(HOST, port, "/score", bodies[:WARMUP_REQUESTS], CONCURRENCY)
    result = load.closed_loop(HOST, port, "/score", bodies[WARMUP_REQUESTS:], CONCURRENCY)
    return {k: result[k] for k in ("requests", "p50_ms", "p99_ms", "rps", "errors")}


def _measure_hop(router: ServerProcess, partition: ServerProcess, payments: list[dict[str, Any]],
                 quick: bool) -> dict[str, Any]:
    """One request at a time, partition 0's cards: straight to it, and through the router (the day's
    payments again, under new transaction ids: :func:`.load.fresh_bodies`)."""
    layout = httpx.get(f"{router.url}/health").json()["layout"]
    owner = Ownership(0, layout["count"], layout["topic_partitions"])
    mine = [p for p in payments if owner.owner(p["card_id"]) == 0]
    n = HOP_REQUESTS[quick] // HOP_BLOCKS
    runs: dict[str, list[dict[str, Any]]] = {"direct": [], "routed": []}
    for block in range(HOP_BLOCKS):
        for name, port in (("direct", partition.port), ("routed", router.port)):
            runs[name].append(load.sequential(HOST, port, "/score", load.fresh_bodies(mine, n, f"hop-{name}-{block}")))
    figures = {f"{name}_{q}": round(statistics.median(r[q] for r in blocks), 3)
               for name, blocks in runs.items() for q in ("p50_ms", "p99_ms")}
    return {**figures, "added_p50_ms": round(figures["routed_p50_ms"] - figures["direct_p50_ms"], 3),
            "requests": n * HOP_BLOCKS, "errors": sum(r["errors"] for blocks in runs.values() for r in blocks)}


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _run(work: Path, env: dict[str, str], broker: EmbeddedBroker, quick: bool) -> dict[str, Any]:
    payments, version, consumed = _prepare(broker, work, quick)
    bodies = [json.dumps(p).encode() for p in payments[:WARMUP_REQUESTS + REQUESTS[quick]]]
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
            load.closed_loop(HOST, router.port, "/score", bodies[:WARMUP_REQUESTS], CONCURRENCY)
            cpu_before = _cpu_s(psutil.Process(router.process.pid))
            measured = load.closed_loop(HOST, router.port, "/score", bodies[WARMUP_REQUESTS:], CONCURRENCY)
            cpu_us = (_cpu_s(psutil.Process(router.process.pid)) - cpu_before) / measured["requests"] * 1e6
            tier = {k: measured[k] for k in ("requests", "p50_ms", "p99_ms", "rps", "errors")}
            hop = {"cpu_us_per_request": round(cpu_us, 1),
                   **_measure_hop(router, partitions[0], payments, quick)}
            routed = [p["routed"] for p in httpx.get(f"{router.url}/health").json()["partitions"]]
    return {"concurrency": CONCURRENCY, "cpus": os.cpu_count(), "one": alone, "two_partitions": tier,
            "rps_ratio": round(tier["rps"] / alone["rps"], 3), "routed": routed, "router_hop": hop,
            "goal": "rps_ratio > 1 where the cores outnumber the processes; errors == 0"}
