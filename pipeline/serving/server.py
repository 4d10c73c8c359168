"""Build the service from ``conf/<env>/`` and run it on uvicorn (what ``fraudctl serve`` calls).

The service reads four slices: ``serving.toml`` (itself), ``registry.toml`` (which registry and
model), ``kafka.toml`` (cluster and topics) and ``ingest.toml`` (the features' label delay and the
raw store), so the service, the Spark job and the gate can never disagree on them.

A service partition (``[partition]``, ``--partition I/N``) learns the transactions topic's
partition count from the cluster at start, the count the producers' murmur2 partitioner divides by.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import uvicorn
from starlette.types import ASGIApp

from pipeline.config import ConfigError
from pipeline.ingest.config import load_ingest_config
from pipeline.kafka.admin import topic_partitions
from pipeline.kafka.settings import KafkaConfig, load_kafka_config
from pipeline.registry.config import load_registry_config
from pipeline.serving.app import create_app
from pipeline.serving.config import PartitionConfig, ServerConfig, ServingConfig, load_serving_config
from pipeline.serving.errors import ServingError
from pipeline.serving.features import payment_time_rules
from pipeline.serving.partitioning import Ownership
from pipeline.serving.service import ScoringService, build_service

# A background thread (feed, reload, publisher) may hold the GIL this long before the request loop
# gets it back; CPython's default of 5 ms alone would use up the whole p99 budget.
SWITCH_INTERVAL_S = 0.0005


def app_for_env(env: str | None, config: ServingConfig | None = None, with_kafka: bool = True) -> ASGIApp:
    """The app for ``conf/<env>/`` (``config`` replaces serving.toml; ``with_kafka=False``: no feed,
    no scores topic)."""
    config = config or load_serving_config(env)
    return create_app(service_for_env(env, config, with_kafka), config.server, config.admin)


def service_for_env(env: str | None, config: ServingConfig | None = None, with_kafka: bool = True) -> ScoringService:
    """The service the app for ``conf/<env>/`` serves, not started (the scoring bench also scores
    with it directly, without HTTP)."""
    config = config or load_serving_config(env)
    ingest = load_ingest_config(env)
    kafka = load_kafka_config(env) if with_kafka else None
    return build_service(config, load_registry_config(env), ingest.features, kafka, ingest.raw.root(),
                         time_rules=payment_time_rules(config.time_rules, ingest.raw),
                         ownership=ownership_of(config.partition, kafka))


def ownership_of(partition: PartitionConfig, kafka: KafkaConfig | None) -> Ownership | None:
    """The service partition ``[partition]`` describes, over the transactions topic as the cluster has
    it now (KafkaUnavailable when it cannot be read); None for an unpartitioned service. A partition
    needs the topics: its merchant state comes from the whole stream, not only from what it scores."""
    if partition.count == 1:
        return None
    if kafka is None:
        raise ConfigError("a scoring partition (--partition I/N) follows the transactions topic for its "
                          "merchants' state: run it with Kafka (no --no-kafka)")
    count = len(topic_partitions(kafka, kafka.transactions_topic))
    return Ownership(partition.index, partition.count, count, partition.addresses)


def uvicorn_config(app: ASGIApp, server: ServerConfig) -> uvicorn.Config:
    # uvloop and httptools (C event loop and HTTP parser: less CPU per request than asyncio's and h11);
    # no access log (a log line per request costs more than parsing it).
    return uvicorn.Config(app, host=server.host, port=server.port, limit_concurrency=server.limit_concurrency,
                          loop="uvloop", http="httptools", access_log=False, server_header=False,
                          log_level="info", lifespan="on", timeout_graceful_shutdown=10)


def run(env: str | None, host: str | None, port: int | None, with_kafka: bool,
        partition: tuple[int, int] | None = None) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn drains requests in flight, then the service stops).
    ``partition`` (index, count) replaces ``[partition]``'s.

    Raises ServingError when the server never started."""
    config = load_serving_config(env)
    server = dataclasses.replace(config.server, host=host or config.server.host,
                                 port=config.server.port if port is None else port)
    config = dataclasses.replace(config, server=server)
    if partition is not None:
        index, count = partition
        config = dataclasses.replace(config, partition=dataclasses.replace(config.partition, index=index,
                                                                           count=count))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    runner = uvicorn.Server(uvicorn_config(app_for_env(env, config, with_kafka), server))
    runner.run()
    if not runner.started:
        raise ServingError(f"the service did not start on {server.host}:{server.port} (port taken, or start-up "
                           "failed): see the log above")
