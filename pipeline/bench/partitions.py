"""``fraudctl bench partitions``: two scoring partitions behind ``fraudctl route`` against one process.

The set-up of :mod:`pipeline.bench.scoring` (embedded broker, a simulated history on the topics, a
model of the production architecture as champion; its helpers, not a copy), then the same next-day
payments, one per request over ``scoring.CONCURRENCY`` keep-alive connections, sent

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

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import torch

from pipeline.bench import scoring
from pipeline.contract import Kind
from pipeline.features.frame import build_feature_frame
from pipeline.ingest.config import load_ingest_config
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from pipeline.registry.store import CHAMPION, connect
from pipeline.serving.process import FRAUDCTL, HOST, ServerProcess
from pipeline.simulation import SimulationConfig, simulate

REQUESTS = {False: 3000, True: 400}
CARDS = {False: 4000, True: 1200}


def run(quick: bool) -> dict[str, Any]:
    with scoring.service_workspace("bench-partitions-") as (work, env, broker):
        return _run(work, env, broker, quick)


def _prepare(env: dict[str, str], broker: EmbeddedBroker, work: Path, quick: bool) -> tuple[list[bytes], int, int]:
    """History on the topics, a champion registered; the next day's request bodies, the champion's
    version and the number of records a ready service has consumed."""
    kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
    env["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
    broker.create_topics(kafka.topics(), kafka.partitions)
    sim = simulate(SimulationConfig(seed=3, start_date="2026-03-01", days=scoring.HISTORY_DAYS + 1,
                                    num_cards=CARDS[quick], num_merchants=400))
    features = build_feature_frame(sim.transactions, sim.labels, load_ingest_config("dev").features)
    features["label"] = sim.truth["is_fraud"].astype(int).to_numpy()
    day = sim.transactions["event_time"].str[:10]
    last = (day == day.max()).to_numpy()
    history, today = sim.transactions[~last], sim.transactions[last].head(scoring.WARMUP_REQUESTS + REQUESTS[quick])
    labels = sim.labels[sim.labels["reported_at"] < today["event_time"].min()]
    registry = RegistryConfig()
    torch.set_num_threads(1)
    version = scoring._register(registry, scoring._train(features[~last], seed=0), work)
    connect(registry).set_registered_model_alias(registry.model_name, CHAMPION, str(version))
    for kind, records, topic in ((Kind.TRANSACTION, scoring._records(history), kafka.transactions_topic),
                                 (Kind.LABEL, scoring._records(labels), kafka.labels_topic)):
        assert publish_records(kafka, topic, kind, records).ok
    bodies = [json.dumps(r).encode() for r in scoring._records(today)]
    return bodies, version, len(history) + len(labels)


def _measure(url: str, bodies: list[bytes]) -> dict[str, Any]:
    asyncio.run(scoring._load(f"{url}/score", bodies[:scoring.WARMUP_REQUESTS]))
    result = asyncio.run(scoring._load(f"{url}/score", bodies[scoring.WARMUP_REQUESTS:]))
    return {k: result[k] for k in ("requests", "p50_ms", "p99_ms", "rps", "errors")}


def _run(work: Path, env: dict[str, str], broker: EmbeddedBroker, quick: bool) -> dict[str, Any]:
    bodies, version, consumed = _prepare(env, broker, work, quick)
    ready = scoring._ours_ready(version, consumed)
    with ServerProcess.fraudctl_serve(env, work / "one.log") as one:
        one.wait_until("/health", ready, scoring.START_TIMEOUT_S)
        alone = _measure(one.url, bodies)
    partitions = [ServerProcess.fraudctl_serve(env, work / f"partition-{i}.log", options=["--partition", f"{i}/2"])
                  for i in range(2)]
    port = free_port()
    router = ServerProcess([sys.executable, "-c", FRAUDCTL, "route", "--partitions",
                            ",".join(f"{HOST}:{p.port}" for p in partitions), "--host", HOST, "--port", str(port)],
                           env, work / "router.log", port)
    with partitions[0], partitions[1]:
        for partition in partitions:
            partition.wait_until("/health", ready, scoring.START_TIMEOUT_S)
        with router:
            router.wait_until("/ready", timeout_s=scoring.START_TIMEOUT_S)
            tier = _measure(router.url, bodies)
            routed = [p["routed"] for p in httpx.get(f"{router.url}/health").json()["partitions"]]
    return {"concurrency": scoring.CONCURRENCY, "cpus": os.cpu_count(), "one": alone, "two_partitions": tier,
            "rps_ratio": round(tier["rps"] / alone["rps"], 3), "routed": routed,
            "goal": "rps_ratio > 1 where the cores outnumber the processes; errors == 0"}
