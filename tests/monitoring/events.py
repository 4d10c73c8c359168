"""Hand-made score events for the monitoring tests, in the service's own encoding (ScoreEvent.to_json)."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta

from pipeline.kafka.reader import ConsumedRecord
from pipeline.serving.score_event import ScoreEvent

REVIEW, BLOCK = 0.2, 0.8  # the operating points the hand-made events were decided at


def rfc3339(day: date, seconds: float) -> str:
    return (datetime.combine(day, time(0)) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def score_event(tid: str, day: date, score: float, *, version: int = 1, at_s: float = 3600.0, scored_after_s: float = 0.05,
                review: float | None = REVIEW, block: float | None = BLOCK,
                features: dict[str, float | int] | None = None) -> ScoreEvent:
    decision = "block" if block is not None and score >= block else "review" if review is not None and score >= review else "allow"
    return ScoreEvent(transaction_id=tid, card_id=f"card-{tid}", event_time=rfc3339(day, at_s), model_version=version,
                      score=score, decision=decision, decided_by="score", rules=(), thresholds=(),
                      features=features or {"amount": 10.0}, scored_at=rfc3339(day, at_s + scored_after_s),
                      review_threshold=review, block_threshold=block)


def records(*placed: tuple[int, ScoreEvent | bytes | None]) -> list[ConsumedRecord]:
    """(partition, event or raw bytes) in topic order -> records with consecutive offsets per partition."""
    offsets: dict[int, int] = {}
    out = []
    for partition, value in placed:
        offset = offsets.get(partition, 0)
        offsets[partition] = offset + 1
        data = value.to_json() if isinstance(value, ScoreEvent) else value
        out.append(ConsumedRecord(partition, offset, 0, None, data))
    return out
