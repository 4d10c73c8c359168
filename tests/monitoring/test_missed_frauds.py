"""Fraud cards that got past a version on a day, per payment, against its validation split."""

from __future__ import annotations

import math

import pytest

from pipeline.metrics import binomial_at_most
from pipeline.monitoring.missed_frauds import (
    MissedFraudReference,
    missed_fraud_cards,
    missed_fraud_reference,
    missed_frauds,
)


def test_a_card_is_missed_only_when_none_of_its_frauds_is_flagged():
    labels = [1, 1, 1, 0, 1, 0]
    flagged = [False, True, False, True, False, False]
    cards = ["a", "a", "b", "b", "c", "c"]
    # a: one fraud flagged (stopped); b: its flagged payment is genuine (missed); c: missed
    assert missed_fraud_cards(labels, flagged, cards) == 2
    assert missed_fraud_cards([0, 0], [False, False], ["a", "b"]) == 0


def test_the_reference_counts_a_card_once_per_day_at_the_validation_threshold():
    labels = [1, 1, 1, 0]
    scores = [0.1, 0.2, 0.9, 0.95]
    times = ["2026-03-01T08:00:00Z", "2026-03-01T20:00:00Z", "2026-03-02T08:00:00Z", "2026-03-02T09:00:00Z"]
    cards = ["a", "a", "a", "b"]
    # card a: missed on the 1st (two frauds, one card-day), stopped on the 2nd (0.9 >= 0.5)
    assert missed_fraud_reference(labels, scores, times, cards, 0.5) == MissedFraudReference(missed=1, payments=4)


def test_the_ratio_and_its_lower_bound_against_the_validation_rate():
    reference = MissedFraudReference(missed=20, payments=10_000)
    labels, flagged = [1] * 30 + [0] * 4_970, [False] * 5_000
    day = missed_frauds(labels, flagged, [f"c{i}" for i in range(5_000)], reference, confidence=0.95)
    assert (day.cards, day.payments) == (30, 5_000)
    assert day.ratio == pytest.approx(3.0)  # 30 per 5,000 against 20 per 10,000
    # the bound is the ratio r at which the day's share of the 50 missed cards, r/(r+2), has 30 or more
    # with probability 5%: P(X <= 29 | 50, share) = 0.95 there
    share = day.ratio_lower / (day.ratio_lower + 2.0)
    assert binomial_at_most(29, 50, share) == pytest.approx(0.95, abs=1e-6)
    assert 1.0 < day.ratio_lower < 3.0
    assert missed_frauds(labels, flagged, [f"c{i}" for i in range(5_000)], reference, 0.0).ratio_lower == day.ratio


def test_without_a_missed_card_in_validation_there_is_no_ratio():
    day = missed_frauds([1, 0], [False, False], ["a", "b"], MissedFraudReference(0, 1_000), 0.95)
    assert day.cards == 1 and math.isnan(day.ratio) and math.isnan(day.ratio_lower)
