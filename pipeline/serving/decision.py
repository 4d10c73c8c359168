"""The fusion policy: rule hits and the model's score -> allow / review / block. Pure.

In order, the first that applies decides:

1. anything on the blocklist (card, merchant or device) -> ``block``, whatever the score;
2. anything on the allowlist -> ``allow``, unless the score is at or above
   ``allowlist_override`` (an extreme score): then step 3 decides as for anyone else;
3. the score: ``>= block_threshold`` -> ``block``, ``>= review_threshold`` -> ``review``, else ``allow``;
   a score that is not a number (a broken model; loading refuses those) -> ``review``, never ``allow``.

A payment on both lists is blocked: a block entry is a deliberate act against a known bad actor,
an allow entry a convenience for known good ones. The thresholds apply to the calibrated fraud
probability the registered model outputs and are those of the version that scored the payment
(:class:`.thresholds.Thresholds`: its operating points, or serving.toml's explicit ones);
``allowlist_override`` is serving.toml's, the same for every version.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from pipeline.serving.rules import RuleHit
from pipeline.serving.thresholds import Thresholds


class Decision(enum.StrEnum):
    ALLOW = "allow"
    REVIEW = "review"
    BLOCK = "block"


@dataclass(frozen=True)
class Verdict:
    """A decision and why: the rules hit and the thresholds the score reached."""

    decision: Decision
    rules: tuple[RuleHit, ...]
    thresholds: tuple[str, ...]  # e.g. ("review_threshold>=0.5", "block_threshold>=0.9")
    decided_by: str  # "blocklist" | "allowlist" | "score" | "no_score"


def thresholds_crossed(score: float, thresholds: Thresholds, allowlist_override: float) -> tuple[str, ...]:
    """Names (with values) of the thresholds ``score`` is at or above, lowest first."""
    levels = (("review_threshold", thresholds.review_threshold), ("block_threshold", thresholds.block_threshold),
              ("allowlist_override", allowlist_override))
    return tuple(f"{name}>={value:g}" for name, value in levels if score >= value)


def decide(score: float, hits: tuple[RuleHit, ...], thresholds: Thresholds, allowlist_override: float) -> Verdict:
    """The decision for a payment with fraud probability ``score`` and rule hits ``hits``, judged at
    the scoring version's ``thresholds``."""
    crossed = thresholds_crossed(score, thresholds, allowlist_override)
    if any(h.action == "block" for h in hits):
        return Verdict(Decision.BLOCK, hits, crossed, "blocklist")
    if not math.isfinite(score):
        return Verdict(Decision.REVIEW, hits, crossed, "no_score")
    if any(h.action == "allow" for h in hits) and score < allowlist_override:
        return Verdict(Decision.ALLOW, hits, crossed, "allowlist")
    if score >= thresholds.block_threshold:
        decision = Decision.BLOCK
    elif score >= thresholds.review_threshold:
        decision = Decision.REVIEW
    else:
        decision = Decision.ALLOW
    return Verdict(decision, hits, crossed, "score")
