"""Producing test records: exact bytes, keys and Kafka timestamps (bad records included)."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime

from confluent_kafka import Producer

from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import load_simulation_config, simulate


def produce(kafka: KafkaConfig, topic: str, records: list[tuple[bytes | None, bytes | None, int | None]],
            partition: int | None = None) -> None:
    """Send ``(key, value, timestamp_ms)`` triples and wait for every acknowledgement."""
    producer = Producer({**kafka.confluent(), "acks": "all", "linger.ms": 5})
    errors = []

    def done(err, _msg):
        if err is not None:
            errors.append(err)

    for key, value, ts in records:
        kwargs = {"partition": partition} if partition is not None else {}
        if ts is not None:
            kwargs["timestamp"] = ts
        producer.produce(topic, value=value, key=key, on_delivery=done, **kwargs)
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp() * 1000)


def event_bytes(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def small_simulation(days: int, num_cards: int = 200, start_date: str = "2026-01-01", seed: int = 11):
    cfg = load_simulation_config("dev")
    return simulate(dataclasses.replace(cfg, seed=seed, start_date=start_date, days=days, num_cards=num_cards,
                                        num_merchants=100))
