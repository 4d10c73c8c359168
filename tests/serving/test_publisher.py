"""The shadow model's opinion in the publisher: decided at the shadow version's own thresholds."""

from __future__ import annotations

import time

import pytest

from pipeline.serving.config import DecisionConfig, ScoresConfig
from pipeline.serving.features import warmup_rows
from pipeline.serving.publisher import ScorePublisher
from pipeline.serving.reloader import LiveVersion
from pipeline.serving.score_event import ScoreEvent
from pipeline.serving.scorer import Scorer
from pipeline.serving.thresholds import Thresholds
from tests.serving import factory

ROWS = 8


def champion_events() -> list[ScoreEvent]:
    """Decisions the champion allowed (no rules hit)."""
    return [ScoreEvent(transaction_id=f"t-{i}", card_id="c", event_time="2026-03-01T00:00:00Z", model_version=1,
                       score=0.0, decision="allow", decided_by="score", rules=(), thresholds=(), features=row,
                       scored_at="2026-03-01T00:00:00Z", review_threshold=0.5, block_threshold=0.9)
            for i, row in enumerate(warmup_rows(factory.PARAMS, ROWS))]


def shadow_opinions(shadow: LiveVersion) -> dict[str, int]:
    # serving.toml's thresholds (0.99/0.995) would allow every one of these payments
    publisher = ScorePublisher(ScoresConfig(publish=False), None,
                               DecisionConfig(review_threshold=0.99, block_threshold=0.995, allowlist_override=1.0),
                               lambda: shadow)
    publisher.start()
    for event in champion_events():
        publisher.submit(event, ())
    publisher.stop()
    return publisher.status()


@pytest.mark.parametrize(("review", "block", "disagreed"), [(0.0, 0.0, ROWS), (1.0, 1.0, 0)])
def test_the_shadow_decides_at_its_own_thresholds(models, review, block, disagreed):
    scorer = Scorer(models.good, 2, explain_top_k=0)
    status = shadow_opinions(LiveVersion(scorer, Thresholds(review, block, "version")))
    assert (status["shadow_scored"], status["shadow_disagreed"]) == (ROWS, disagreed)


def wait_for(condition, timeout_s: float = 60.0) -> bool:
    """True as soon as ``condition()`` holds; the bound is generous (a loaded 2-core machine), never a pace."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_an_idle_publisher_parks_and_the_next_decision_wakes_it():
    publisher = ScorePublisher(ScoresConfig(publish=False), None,
                               DecisionConfig(review_threshold=0.5, block_threshold=0.9, allowlist_override=1.0),
                               lambda: None)
    publisher.start()
    try:
        assert wait_for(lambda: publisher._parked), "an empty queue should park the thread, not poll it forever"
        publisher.submit(champion_events()[0], ())
        assert wait_for(lambda: publisher.status()["pending"] == 0), "a parked thread missed a decision"
        assert wait_for(lambda: publisher._parked), "the thread should park again once the queue is empty"
    finally:
        publisher.stop(timeout_s=60.0)
    assert not publisher._thread.is_alive(), "stop() must wake a parked thread"
