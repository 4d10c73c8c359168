"""A live day for the monitor's integration tests: a registered version and its decisions, published
to the real broker's scores topic (the raw store's side is tests/monitoring/raw_store.py)."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import pandas as pd
from confluent_kafka import Producer

from models.fraud_mlp import FraudModel
from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    DecisionBudget,
    OperatingPoints,
    choose_operating_points,
    write_operating_points,
)
from pipeline.kafka.settings import KafkaConfig
from pipeline.registry.config import RegistryConfig
from pipeline.registry.tracking import register_run
from pipeline.serving.score_event import ScoreEvent
from tests.registry import factory
from tests.registry.conftest import World

# Wide enough that the factory's small validation day gives a recall worth judging (the default
# budget flags 2 of its 400 rows).
BUDGET = DecisionBudget(review_rate=0.2, block_precision=0.0, block_rate=0.02)


def register(world: World, config: RegistryConfig, model: FraudModel, name: str) -> tuple[int, OperatingPoints]:
    """A training run of ``model`` registered (operating points of :data:`BUDGET` on its validation split)."""
    run_dir = world.run_dir(name, model)
    validation = read_split(world.root, world.manifest, "validation")
    points = choose_operating_points(validation["label"].to_numpy(), factory.score(model, validation), BUDGET)
    write_operating_points(run_dir / "model", points)
    return register_run(run_dir, config), points


def served_day(world: World, model: FraudModel, day: date, version: int, points: OperatingPoints,
               stuck: dict[str, float] | None = None) -> tuple[pd.DataFrame, list[ScoreEvent]]:
    """The test split's payments moved to ``day`` (ids prefixed with it) and decided by ``model``
    (``stuck``: features the service served as a constant); the frame (with label) and the score events."""
    frame = read_split(world.root, world.manifest, "test")
    frame["transaction_id"] = f"{day}-" + frame["transaction_id"]
    frame["event_time"] = [datetime.combine(day, time(0), tzinfo=UTC) + (t - t.normalize()) for t in frame["event_time"]]
    frame = frame.sort_values("event_time", kind="stable", ignore_index=True)  # decided as they arrive
    served = frame.assign(**(stuck or {}))
    scores = factory.score(model, served)
    events = [ScoreEvent(transaction_id=row["transaction_id"], card_id=row["card_id"], event_time=_rfc(row["event_time"]),
                         model_version=version, score=float(score), decision="allow", decided_by="score", rules=(),
                         thresholds=(), features=_features(row),
                         scored_at=_rfc(row["event_time"] + timedelta(milliseconds=40)),
                         review_threshold=points.review_threshold, block_threshold=points.block_threshold)
              for (_, row), score in zip(served.iterrows(), scores, strict=True)]
    return frame, events


def _features(row: pd.Series) -> dict[str, float | int]:
    return {**{c: float(row[c]) for c in factory.NUMERIC}, **{c: int(row[c]) for c in factory.CATEGORICAL}}


def _rfc(t: pd.Timestamp) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f") + "Z"


def publish(kafka: KafkaConfig, topic: str, messages: list[tuple[str | None, bytes | None]]) -> None:
    """(key, value) records, acknowledged by the broker, in order."""
    producer = Producer({**kafka.confluent(), "acks": "all", "enable.idempotence": True})
    failures = []
    for key, value in messages:
        producer.produce(topic, key=key.encode() if key else None, value=value,
                         on_delivery=lambda err, _m: failures.append(err) if err else None)
    assert producer.flush(30) == 0 and not failures, failures
