"""The fusion policy: blocklist > allowlist (unless the score is extreme) > score thresholds."""

from __future__ import annotations

import math

import pytest

from pipeline.config import ConfigError
from pipeline.serving.config import DecisionConfig
from pipeline.serving.decision import Decision, decide
from pipeline.serving.rules import RuleHit

POLICY = DecisionConfig(review_threshold=0.5, block_threshold=0.9, allowlist_override=0.99)
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
    verdict = decide(score, (), POLICY)
    assert (verdict.decision, verdict.thresholds, verdict.decided_by) == (decision, crossed, "score")


def test_a_blocklist_hit_blocks_whatever_the_score():
    verdict = decide(0.001, (BLOCK_CARD,), POLICY)
    assert (verdict.decision, verdict.decided_by, verdict.rules) == (Decision.BLOCK, "blocklist", (BLOCK_CARD,))


def test_an_allowlist_hit_allows_unless_the_score_is_extreme():
    assert decide(0.95, (ALLOW_CARD,), POLICY).decision is Decision.ALLOW  # above block_threshold, still allowed
    extreme = decide(0.995, (ALLOW_CARD,), POLICY)
    assert (extreme.decision, extreme.decided_by) == (Decision.BLOCK, "score")


def test_block_wins_over_allow():
    assert decide(0.1, (BLOCK_CARD, RuleHit("allow", "merchant", "m")), POLICY).decision is Decision.BLOCK


def test_a_missing_score_is_never_allowed():
    assert decide(math.nan, (ALLOW_CARD,), POLICY).decision is Decision.REVIEW
    assert decide(math.nan, (BLOCK_CARD,), POLICY).decision is Decision.BLOCK


def test_thresholds_must_be_ordered():
    with pytest.raises(ConfigError, match="review_threshold <= block_threshold"):
        DecisionConfig(review_threshold=0.9, block_threshold=0.5)
