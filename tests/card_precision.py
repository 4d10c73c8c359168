"""Card precision@k computed the plain way, for tests to check the protocol's figure against.

The definition of pipeline/evaluation/protocol.py's docstring (and pipeline/metrics.py's daily_card_precision)
read literally, with none of their code: per UTC day, a card's score is its best payment's and the
card is fraudulent if any of its payments that day is; the fraudulent cards among the ``k`` best-scored
(ties: the smaller card id), over ``k``; cards caught in an earlier day's top ``k`` leave later days;
the mean over days.
"""

from __future__ import annotations

import pandas as pd


def card_precision_at_k(scored: pd.DataFrame, k: int = 100) -> float:
    """``scored``: rows with ``card_id``, ``event_time`` (UTC), ``score`` and ``label``, known-compromised
    cards' rows already removed."""
    caught: set[str] = set()
    daily = []
    for _, day in scored.groupby(scored["event_time"].dt.tz_convert("UTC").dt.date, sort=True):
        cards = day.groupby("card_id").agg(score=("score", "max"), fraud=("label", "max"))  # sorted by card id
        top = cards[~cards.index.isin(caught)].sort_values("score", ascending=False, kind="stable").head(k)
        hits = top.index[top["fraud"] == 1]
        caught.update(hits)
        daily.append(len(hits) / k)
    return sum(daily) / len(daily)
