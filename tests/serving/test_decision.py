"""The fusion policy: blocklist > allowlist (unless the score is extreme) > the deciding version's thresholds."""

from __future__ import annotations

import math

import pytest

from pipeline.config import ConfigError
from pipeline.serving.config import DecisionConfig
from pipeline.serving.decision import Decision, decide
from pipeline.serving.rules import RuleHit
from pipeline.serving.thresholds import Thresholds

THRESHOLDS = Thresholds(review_threshold=0.5, block_threshold=0.9, source="version")
OVERRIDE = 0.99  # allowlist_override


def decide_at(score, hits=(), thresholds=THRESHOLDS):
    return decide(score, hits, thresholds, OVERRIDE)
BLOCK_CARD = RuleHit("block", "card", "c1")
ALLOW_CARD = RuleHit("allow", "card", "c1")


@pytest.mark.parametrize(("score", "decision", "crossed"), [
    (0.0, Decision.ALLOW, ()),
    (0.4999, Decision.ALLOW, ()),
    (0.5, Decision.REVIEW, ("review_threshold>=0.5",)),  # thresholds are inclusive
    (0.9, Decision.BLOCK, ("review_threshold>=0.5", "block_threshold>=0.9")),
    (1.0, Decision.BLOCK, ("review_threshold>=0.5", "block_threshold>=0.9", "allowlist_override>=0.99")),
])
def test_without_rules_the_thresholds_decide(score, decision, crossed):
    verdict = decide_at(score)
    assert (verdict.decision, verdict.thresholds, verdict.decided_by) == (decision, crossed, "score")


def test_a_blocklist_hit_blocks_whatever_the_score():
    verdict = decide_at(0.001, (BLOCK_CARD,))
    assert (verdict.decision, verdict.decided_by, verdict.rules) == (Decision.BLOCK, "blocklist", (BLOCK_CARD,))


def test_an_allowlist_hit_allows_unless_the_score_is_extreme():
    assert decide_at(0.95, (ALLOW_CARD,)).decision is Decision.ALLOW  # above block_threshold, still allowed
    extreme = decide_at(0.995, (ALLOW_CARD,))
    assert (extreme.decision, extreme.decided_by) == (Decision.BLOCK, "score")


def test_block_wins_over_allow():
    assert decide_at(0.1, (BLOCK_CARD, RuleHit("allow", "merchant", "m"))).decision is Decision.BLOCK


def test_a_missing_score_is_never_allowed():
    assert decide_at(math.nan, (ALLOW_CARD,)).decision is Decision.REVIEW
    assert decide_at(math.nan, (BLOCK_CARD,)).decision is Decision.BLOCK


def test_the_versions_thresholds_decide_not_fixed_ones():
    low = Thresholds(review_threshold=0.02, block_threshold=0.3, source="version")
    assert [decide_at(s, thresholds=low).decision for s in (0.019, 0.02, 0.3)] == [
        Decision.ALLOW, Decision.REVIEW, Decision.BLOCK]
    assert decide_at(0.3, thresholds=low).thresholds == ("review_threshold>=0.02", "block_threshold>=0.3")
    assert decide_at(0.3).decision is Decision.ALLOW  # the same score at other thresholds


def test_the_allowlist_override_is_the_configs_whatever_the_thresholds():
    low = Thresholds(review_threshold=0.02, block_threshold=0.3, source="version")
    assert decide(0.5, (ALLOW_CARD,), low, 0.99).decision is Decision.ALLOW  # above block, below the override
    assert decide(0.5, (ALLOW_CARD,), low, 0.4).decision is Decision.BLOCK


def test_thresholds_must_be_ordered():
    with pytest.raises(ConfigError, match="review_threshold <= block_threshold"):
        DecisionConfig(review_threshold=0.9, block_threshold=0.5)
