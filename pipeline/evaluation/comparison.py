"""Challenger vs champion on the same holdout rows: how different they are, and how sure we are.

Pure numpy, no I/O. :func:`compare_models` turns both models' scores on one holdout into a
:class:`Comparison` that :func:`pipeline.evaluation.gate.should_promote` decides on and the gate report
stores and prints:

* AUC-ROC difference with DeLong's paired interval (closed form, exact for the observed rows),
  clustered by card when the rows carry card ids;
* average-precision difference with a paired bootstrap interval over cards (AP has no closed-form
  variance); seeded, so the same rows always give the same interval;
* recall and precision at the review budget: both models flag the same top share of the rows (the
  challenger's budget), what the review team would work through with either; paired bootstrap
  differences on the same replicates as AP;
* PSI of the challenger's scores against the champion's.

Only rows both models scored (finite scores) enter; the NaN-score guardrail judges the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.evaluation.config import IntervalConfig
from pipeline.metrics import (
    PairedDifference,
    bootstrap_intervals,
    delong_auc_difference,
    paired_bootstrap_differences,
    population_stability_index,
    precision_at_rate,
    recall_at_rate,
)


@dataclass(frozen=True)
class Comparison:
    """Challenger minus champion on ``n`` holdout rows both scored (``n_fraud`` of them frauds).

    ``recall_at_budget`` / ``precision_at_budget``: both models flagging the top ``review_budget``
    share of those rows. A comparison stored before budgets existed reads back with ``review_budget``
    None and undefined (NaN) budget intervals.
    """

    auc_roc: PairedDifference
    average_precision: PairedDifference
    psi: float  # challenger's score distribution against the champion's
    n: int
    n_fraud: int
    review_budget: float | None
    recall_at_budget: PairedDifference
    precision_at_budget: PairedDifference

    def to_dict(self) -> dict[str, Any]:
        return {"auc_roc": self.auc_roc.to_dict(), "average_precision": self.average_precision.to_dict(),
                "psi": self.psi, "n": self.n, "n_fraud": self.n_fraud, "review_budget": self.review_budget,
                "recall_at_budget": self.recall_at_budget.to_dict(),
                "precision_at_budget": self.precision_at_budget.to_dict()}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Comparison:
        """Inverse of :meth:`to_dict`, also after a JSON round trip (NaN stored as null) and for a
        comparison stored before the budget metrics existed."""
        auc = PairedDifference.from_dict(d["auc_roc"])
        missing = PairedDifference(math.nan, math.nan, math.nan, auc.confidence, "none", 0)
        budget = d.get("review_budget")
        return Comparison(
            auc_roc=auc, average_precision=PairedDifference.from_dict(d["average_precision"]),
            psi=math.nan if d["psi"] is None else float(d["psi"]), n=int(d["n"]), n_fraud=int(d["n_fraud"]),
            review_budget=None if budget is None else float(budget),
            recall_at_budget=PairedDifference.from_dict(d["recall_at_budget"]) if d.get("recall_at_budget") else missing,
            precision_at_budget=(PairedDifference.from_dict(d["precision_at_budget"]) if d.get("precision_at_budget")
                                 else missing),
        )


def compare_models(labels: np.ndarray, challenger_scores: np.ndarray, champion_scores: np.ndarray,
                   card_ids: np.ndarray | None, settings: IntervalConfig, *, review_rate: float) -> Comparison:
    """Paired differences (challenger - champion) on the rows both models scored, the budget
    metrics at flagged share ``review_rate``.

    ``card_ids`` (one per row, or None) makes every interval resample and cluster by card: a
    card's payments are not independent evidence (one compromised card often carries several
    frauds), so treating rows as independent would make the intervals too narrow.
    """
    both = np.isfinite(challenger_scores) & np.isfinite(champion_scores)
    y, chal, champ = labels[both], challenger_scores[both], champion_scores[both]
    cards = None if card_ids is None else np.asarray(card_ids)[both]
    auc = delong_auc_difference(y, chal, champ, clusters=cards, confidence=settings.confidence)
    ap, recall, precision = paired_bootstrap_differences(
        y, chal, champ, ("average_precision", "recall_at_rate", "precision_at_rate"), clusters=cards,
        resamples=settings.bootstrap_resamples, confidence=settings.confidence, seed=settings.seed, rate=review_rate,
    )
    return Comparison(auc_roc=auc, average_precision=ap, psi=population_stability_index(champ, chal),
                      n=int(y.size), n_fraud=int(y.sum()), review_budget=review_rate,
                      recall_at_budget=recall, precision_at_budget=precision)


def budget_metrics(labels: np.ndarray, scores: np.ndarray, review_rate: float, card_ids: np.ndarray | None = None,
                   intervals: IntervalConfig | None = None) -> dict[str, float]:
    """One model's ``recall_at_budget`` and ``precision_at_budget`` on the rows it scored (finite
    scores): what flagging its top ``review_rate`` share finds. NaN when undefined (no frauds, no rows).

    With ``intervals``, also ``recall_at_budget_lower`` / ``_upper``: the recall's interval from the
    bootstrap the comparison uses (the same resamples, confidence and seed, by card when ``card_ids``
    is given), which is what the model's recall on later days of the portfolio is judged against.
    """
    finite = np.isfinite(scores)
    y, s = labels[finite], scores[finite]
    figures = {"recall_at_budget": recall_at_rate(y, s, review_rate),
               "precision_at_budget": precision_at_rate(y, s, review_rate)}
    if intervals is not None:
        cards = None if card_ids is None else np.asarray(card_ids)[finite]
        (recall,) = bootstrap_intervals(y, s, ("recall_at_rate",), clusters=cards, resamples=intervals.bootstrap_resamples,
                                        confidence=intervals.confidence, seed=intervals.seed, rate=review_rate)
        figures |= {"recall_at_budget_lower": recall.lower, "recall_at_budget_upper": recall.upper}
    return figures
