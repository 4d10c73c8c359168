"""Build the service from ``conf/<env>/`` and run it on uvicorn (what ``fraudctl serve`` calls).

The service reads four slices: ``serving.toml`` (itself), ``registry.toml`` (which registry and
model), ``kafka.toml`` (cluster and topics) and ``ingest.toml`` (the features' label delay and the
raw store), so the service, the Spark job and the gate can never disagree on them.
"""

from __future__ import annotations

import dataclasses
import logging
import sys

import uvicorn
from starlette.types import ASGIApp

from pipeline.ingest.config import load_ingest_config
from pipeline.kafka.settings import load_kafka_config
from pipeline.registry.config import load_registry_config
from pipeline.serving.app import create_app
from pipeline.serving.config import ServerConfig, ServingConfig, load_serving_config
from pipeline.serving.errors import ServingError
from pipeline.serving.features import payment_time_rules
from pipeline.serving.service import build_service

# A background thread (feed, reload, publisher) may hold the GIL this long before the request loop
# gets it back; CPython's default of 5 ms alone would use up the whole p99 budget.
SWITCH_INTERVAL_S = 0.0005


def app_for_env(env: str | None, config: ServingConfig | None = None, with_kafka: bool = True) -> ASGIApp:
    """The app for ``conf/<env>/`` (``config`` replaces serving.toml; ``with_kafka=False``: no feed,
    no scores topic)."""
    config = config or load_serving_config(env)
    ingest = load_ingest_config(env)
    service = build_service(config, load_registry_config(env), ingest.features,
                            load_kafka_config(env) if with_kafka else None, ingest.raw.root(),
                            time_rules=payment_time_rules(config.time_rules, ingest.raw))
    return create_app(service, config.server, config.admin)


def uvicorn_config(app: ASGIApp, server: ServerConfig) -> uvicorn.Config:
    # uvloop and httptools (C event loop and HTTP parser: less CPU per request than asyncio's and h11);
    # no access log (a log line per request costs more than parsing it).
    return uvicorn.Config(app, host=server.host, port=server.port, limit_concurrency=server.limit_concurrency,
                          loop="uvloop", http="httptools", access_log=False, server_header=False,
                          log_level="info", lifespan="on", timeout_graceful_shutdown=10)


def run(env: str | None, host: str | None, port: int | None, with_kafka: bool) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn drains requests in flight, then the service stops).

    Raises ServingError when the server never started."""
    config = load_serving_config(env)
    server = dataclasses.replace(config.server, host=host or config.server.host,
                                 port=config.server.port if port is None else port)
    config = dataclasses.replace(config, server=server)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    runner = uvicorn.Server(uvicorn_config(app_for_env(env, config, with_kafka), server))
    runner.run()
    if not runner.started:
        raise ServingError(f"the service did not start on {server.host}:{server.port} (port taken, or start-up "
                           "failed): see the log above")
