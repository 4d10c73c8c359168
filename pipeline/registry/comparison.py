"""Challenger vs champion on the same holdout rows: how different they are, and how sure we are.

Pure numpy, no I/O. :func:`compare_models` turns both models' scores on one holdout into a
:class:`Comparison` that :func:`pipeline.registry.gate.should_promote` decides on and the gate report
stores and prints:

* AUC-ROC difference with DeLong's paired interval (closed form, exact for the observed rows),
  clustered by card when the rows carry card ids;
* average-precision difference with a paired bootstrap interval over cards (AP has no closed-form
  variance); seeded, so the same rows always give the same interval;
* PSI of the challenger's scores against the champion's.

Only rows both models scored (finite scores) enter; the NaN-score guardrail judges the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.metrics import (
    PairedDifference,
    delong_auc_difference,
    paired_bootstrap_difference,
    population_stability_index,
)
from pipeline.registry.config import IntervalConfig


@dataclass(frozen=True)
class Comparison:
    """Challenger minus champion on ``n`` holdout rows both scored (``n_fraud`` of them frauds)."""

    auc_roc: PairedDifference
    average_precision: PairedDifference
    psi: float  # challenger's score distribution against the champion's
    n: int
    n_fraud: int

    def to_dict(self) -> dict[str, Any]:
        return {"auc_roc": self.auc_roc.to_dict(), "average_precision": self.average_precision.to_dict(),
                "psi": self.psi, "n": self.n, "n_fraud": self.n_fraud}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Comparison:
        """Inverse of :meth:`to_dict`, also after a JSON round trip (NaN stored as null)."""
        return Comparison(
            auc_roc=PairedDifference.from_dict(d["auc_roc"]),
            average_precision=PairedDifference.from_dict(d["average_precision"]),
            psi=math.nan if d["psi"] is None else float(d["psi"]), n=int(d["n"]), n_fraud=int(d["n_fraud"]),
        )


def compare_models(labels: np.ndarray, challenger_scores: np.ndarray, champion_scores: np.ndarray,
                   card_ids: np.ndarray | None, settings: IntervalConfig) -> Comparison:
    """Paired differences (challenger - champion) on the rows both models scored.

    ``card_ids`` (one per row, or None) makes every interval resample and cluster by card: a
    card's payments are not independent evidence (one compromised card often carries several
    frauds), so treating rows as independent would make the intervals too narrow.
    """
    both = np.isfinite(challenger_scores) & np.isfinite(champion_scores)
    y, chal, champ = labels[both], challenger_scores[both], champion_scores[both]
    cards = None if card_ids is None else np.asarray(card_ids)[both]
    auc = delong_auc_difference(y, chal, champ, clusters=cards, confidence=settings.confidence)
    ap = paired_bootstrap_difference(
        y, chal, champ, "average_precision", clusters=cards, resamples=settings.bootstrap_resamples,
        confidence=settings.confidence, seed=settings.seed,
    )
    return Comparison(auc_roc=auc, average_precision=ap, psi=population_stability_index(champ, chal),
                      n=int(y.size), n_fraud=int(y.sum()))
