"""Kafka connection and topic settings (``conf/<env>/kafka.toml``).

Connection fields can be overridden by environment variables (``KAFKA_*``) and CLI options,
so the embedded-broker defaults and a real SASL/SSL cluster use the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.config import env_override, load_section


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
        """librdkafka (confluent-kafka) client settings for this cluster."""
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
