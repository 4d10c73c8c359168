"""Fraud patterns. A generator turns the start days of ``n`` incidents (an incident is one attack
on one card) into one :class:`~pipeline.simulation.blocks.EventBlock` of fraudulent payments,
``incident`` numbering them from 0. What each pattern looks like and which features catch it:
:mod:`.online` (stolen card details on the web), :mod:`.counterfeit` (cloned cards in person) and
:mod:`.compromise` (a stolen card used for a few days, its habits shifted).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.simulation.config import FraudShapeConfig
from pipeline.simulation.patterns.common import FraudContext, PatternGenerator
from pipeline.simulation.patterns.compromise import compromise_window, mean_window_events
from pipeline.simulation.patterns.counterfeit import compromised_merchant, geo_impossible
from pipeline.simulation.patterns.online import (
    CARD_TEST_TRIES,
    account_takeover,
    amount_threshold,
    card_testing,
    low_and_slow,
)


@dataclass(frozen=True)
class Pattern:
    generate: PatternGenerator
    # Mean fraudulent payments per incident: turns the wanted fraud payments into incidents.
    mean_events: Callable[[FraudShapeConfig], float]


GENERATORS: dict[str, Pattern] = {
    "card_testing": Pattern(card_testing, lambda s: sum(CARD_TEST_TRIES) / 2 + s.card_test_cashout_share),
    "account_takeover": Pattern(account_takeover, lambda s: 4.0),
    "compromised_merchant": Pattern(compromised_merchant, lambda s: 2.5),
    "geo_impossible": Pattern(geo_impossible, lambda s: 2.0),
    "amount_threshold": Pattern(amount_threshold, lambda s: 2.0),
    "low_and_slow": Pattern(low_and_slow, lambda s: 6.5),
    "compromise_window": Pattern(compromise_window, mean_window_events),
}

__all__ = ["GENERATORS", "FraudContext", "Pattern"]
