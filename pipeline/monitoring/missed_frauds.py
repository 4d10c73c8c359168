"""Pure: how many fraud cards got past a version on a day, per payment, against its validation split.

A fraud pattern the model never learned is scored like a genuine payment. Where the review budget
caps recall low, a day's recall cannot tell that from chance: a card's frauds are caught or missed
together, so a healthy e-commerce week's daily recall swings 0.24-0.66 around 0.40, and a new
pattern's frauds are few per card. What does move is the number of fraud cards that get through:
the new pattern adds cards, and the review budget adds no catches (the decisions bench's e-commerce
portfolio: about 31 missed cards a day expected, 56, 80 and 96 on the new pattern's first days).

* evidence is counted by card and day: a **missed fraud card** is a card with a matured fraud on
  the day none of whose frauds that day was flagged (score >= the review threshold it was decided at);
* the day's **ratio**: its missed fraud cards per payment over the validation split's (missed card-days
  at the version's validation review threshold, per validation payment);
* its one-sided lower confidence bound treats both counts as Poisson: given their sum, the day's count
  is binomial with share ``r x / (r x + y)`` (``x``, ``y``: the day's and validation's payments, ``r``:
  the ratio), so the exact (Clopper-Pearson) lower bound of that share bounds ``r``. A small
  validation split (the quick default bench: 6 missed card-days) widens the bound by itself.

The monitor calls a day short when that bound is above ``missed_fraud_factor``: a doubling of
the frauds getting through is either a pattern the model does not know or an attack beyond what the
review budget can stop; either way the risk team has to look. A factor rather than 1: a healthy
portfolio's test week, a week after validation, lets through up to 2.1-2.4x its validation days'
rate (the decisions bench's high-risk portfolios, quick size; lower bounds up to 1.75), which is
drift, not breakage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline.metrics import binomial_upper_bound


@dataclass(frozen=True)
class MissedFraudReference:
    """The validation split's missed fraud card-days (at the version's validation review threshold) and payments."""

    missed: int
    payments: int


@dataclass(frozen=True)
class MissedFrauds:
    """One day's missed fraud cards against the reference."""

    cards: int  # fraud cards with no flagged fraud on the day
    payments: int
    ratio: float  # (cards / payments) / (reference missed / reference payments); NaN without a reference rate
    ratio_lower: float  # its one-sided lower confidence bound (the ratio itself at confidence 0)


def missed_fraud_cards(labels, flagged, cards, days=None) -> int:
    """Cards (card-days when ``days`` are given) with a fraud among the rows, none of whose fraud rows is flagged."""
    y = np.asarray(labels).astype(bool)
    if not y.any():
        return 0
    frame = pd.DataFrame({"card": np.asarray(cards)[y], "flagged": np.asarray(flagged).astype(bool)[y]})
    keys = ["card"]
    if days is not None:
        frame["day"] = np.asarray(days)[y]
        keys.append("day")
    return int((~frame.groupby(keys, sort=False)["flagged"].any()).sum())


def missed_fraud_reference(labels, scores, event_times, cards, review_threshold: float) -> MissedFraudReference:
    """The reference from a version's validation split (labels, scores, event times, card ids of its
    rows) at its validation ``review_threshold``; a card counts once per UTC day, as the monitor counts it."""
    days = pd.to_datetime(pd.Series(np.asarray(event_times)), utc=True, format="ISO8601").dt.date.to_numpy()
    flagged = np.asarray(scores, dtype=np.float64) >= review_threshold
    return MissedFraudReference(missed_fraud_cards(labels, flagged, cards, days), int(np.asarray(labels).size))


def missed_frauds(labels, flagged, cards, reference: MissedFraudReference, confidence: float) -> MissedFrauds:
    """The day's missed fraud cards (``labels``: matured reports of its payments; ``flagged`` at the
    thresholds they were decided at) and their ratio to ``reference``'s rate, with its one-sided lower
    bound at ``confidence`` (module doc). A reference without a missed card, or a day without payments,
    has no ratio (NaN)."""
    payments = int(np.asarray(labels).size)
    missed = missed_fraud_cards(labels, flagged, cards)
    if reference.missed == 0 or reference.payments == 0 or payments == 0:
        return MissedFrauds(missed, payments, math.nan, math.nan)
    scale = reference.payments / payments
    ratio = missed / reference.missed * scale
    if confidence <= 0:
        return MissedFrauds(missed, payments, ratio, ratio)
    total = missed + reference.missed
    # lower bound of the day's share of the pooled count: 1 - the upper bound of validation's share
    share = 1.0 - binomial_upper_bound(reference.missed, total, confidence)
    lower = share / (1.0 - share) * scale if share < 1.0 else math.inf
    return MissedFrauds(missed, payments, ratio, lower)
