"""Kafka connection and topic settings (``conf/<env>/kafka.toml``), and where librdkafka logs.

Connection fields can be overridden by environment variables (``KAFKA_*``) and CLI options,
so the embedded-broker defaults and a real SASL/SSL cluster use the same code.

librdkafka writes its own log lines straight to stderr unless the client is given a Python
logger: a broker that is down yields a "Connection refused" line per reconnect attempt, hundreds
per minute. Clients built with :func:`with_log_routing` log through :data:`LIBRDKAFKA_LOGGER`
instead; the application decides where that goes (ingest: the run's log file, see
:mod:`pipeline.ingest.run_log`). Left unconfigured, the lines are dropped, never printed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import env_override, load_section

LIBRDKAFKA_LOGGER = "pipeline.kafka.librdkafka"
# A library's logger: silent unless the application attaches a handler (no lastResort to stderr).
logging.getLogger(LIBRDKAFKA_LOGGER).addHandler(logging.NullHandler())


def with_log_routing(client: dict[str, Any]) -> dict[str, Any]:
    """``client`` (librdkafka settings) plus ``logger``: the client's log lines go to
    :data:`LIBRDKAFKA_LOGGER`, delivered whenever the client is polled, never to stderr."""
    return {**client, "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}


@dataclass(frozen=True)
class EmbeddedBrokerConfig:
    """Where ``fraudctl broker start`` runs the Tansu broker."""

    host: str = "127.0.0.1"
    port: int = 9092
    start_timeout_s: float = 30.0


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = env_override("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    security_protocol: str = env_override("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    sasl_mechanism: str | None = env_override("KAFKA_SASL_MECHANISM", None)
    sasl_username: str | None = env_override("KAFKA_SASL_USERNAME", None)
    sasl_password: str | None = env_override("KAFKA_SASL_PASSWORD", None)
    ssl_cafile: str | None = env_override("KAFKA_SSL_CAFILE", None)
    transactions_topic: str = "transactions"
    labels_topic: str = "fraud-labels"
    partitions: int = 4  # used when this project creates the topics (embedded broker, demo)
    request_timeout_s: float = 15.0
    embedded: EmbeddedBrokerConfig = field(default_factory=EmbeddedBrokerConfig)

    def confluent(self) -> dict[str, Any]:
        """librdkafka (confluent-kafka) client settings for this cluster (plain values: JSON-safe,
        shipped to Spark read tasks; add the logger with :func:`with_log_routing`)."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password
        if self.ssl_cafile:
            conf["ssl.ca.location"] = self.ssl_cafile
        return conf

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python client settings for this cluster."""
        conf: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "request_timeout_ms": int(self.request_timeout_s * 1000),
        }
        if self.sasl_mechanism:
            conf["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl_plain_username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl_plain_password"] = self.sasl_password
        if self.ssl_cafile:
            conf["ssl_cafile"] = self.ssl_cafile
        return conf

    def topics(self) -> tuple[str, str]:
        return (self.transactions_topic, self.labels_topic)


def load_kafka_config(env: str | None = None) -> KafkaConfig:
    return load_section(KafkaConfig, "kafka", env)
