"""Bad records the demo mixes into each night, so the ingest accounting has something to show.

Each is derived deterministically from the night's own transactions: duplicates re-send a real
record; the others break one rule of the contract each (the reason ingest must name).
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from confluent_kafka import Producer

from pipeline.contract import RejectReason
from pipeline.kafka.admin import KafkaUnavailable
from pipeline.kafka.producer import PARTITIONER, dumps_event
from pipeline.kafka.settings import KafkaConfig


def _broken(base: dict[str, Any]) -> list[tuple[RejectReason | None, bytes]]:
    """Every kind of bad record the demo makes from ``base``: ``(expected reason or None for a duplicate, raw value)``."""
    def variant(suffix: str, **changes: Any) -> dict[str, Any]:
        return {**base, "transaction_id": f"{base['transaction_id']}-{suffix}", **changes}

    catalogue: list[tuple[RejectReason | None, bytes]] = [
        (None, dumps_event(base).encode()),  # a producer retry: same record again
        (RejectReason.MALFORMED_JSON, dumps_event(base).encode()[:-7]),  # truncated message
        (RejectReason.NEGATIVE_AMOUNT, dumps_event(variant("neg", amount=-abs(base["amount"]))).encode()),
        (RejectReason.NON_FINITE_AMOUNT, json.dumps(variant("nan", amount=float("nan"))).encode()),
        (RejectReason.UNKNOWN_SCHEMA_VERSION, dumps_event(variant("v2", schema_version=2)).encode()),
        (RejectReason.BAD_CURRENCY, dumps_event(variant("cur", currency="euro")).encode()),
        (RejectReason.BAD_TIME, dumps_event(variant("time", event_time="31/01/2026 10:00")).encode()),
        (RejectReason.MISSING_FIELD, dumps_event({k: v for k, v in variant("miss").items() if k != "amount"}).encode()),
        (RejectReason.WRONG_TYPE, dumps_event(variant("type", amount=str(base["amount"]))).encode()),
        (RejectReason.MALFORMED_JSON, b"\xff\xfe not utf-8"),
    ]
    return catalogue


def dirty_transactions(transactions: pd.DataFrame, n: int) -> list[tuple[RejectReason | None, bytes, bytes]]:
    """``n`` bad or duplicate transaction records as ``(expected reason, key, value)``."""
    if n <= 0 or transactions.empty:
        return []
    # Base them on the window's latest payments: a retried duplicate arrives soon after the original,
    # not days later (which ingest would rightly quarantine as a late event instead).
    recent = transactions.tail(n)
    out = []
    for i in range(n):
        row = recent.iloc[i % len(recent)]
        base = {k: v for k, v in row.to_dict().items() if v is not None and v == v}  # v == v: not NaN
        catalogue = _broken(base)
        reason, value = catalogue[i % len(catalogue)]
        out.append((reason, str(base["card_id"]).encode(), value))
    return out


def publish_raw(kafka: KafkaConfig, topic: str, messages: list[tuple[bytes, bytes]]) -> int:
    """Send raw ``(key, value)`` messages as they are (no validation: that is the point); returns acks."""
    acked = 0
    errors: list[str] = []

    def delivered(err, _msg) -> None:
        nonlocal acked
        if err is None:
            acked += 1
        else:
            errors.append(str(err))

    producer = Producer({**kafka.confluent(), "acks": "all", "enable.idempotence": True,
                         "partitioner": PARTITIONER})  # cards land where the scoring tier routes them
    for key, value in messages:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    producer.flush(4 * kafka.request_timeout_s)
    if acked != len(messages):
        raise KafkaUnavailable(f"{len(messages) - acked} of {len(messages)} raw records not acknowledged: {errors[:3]}")
    return acked
