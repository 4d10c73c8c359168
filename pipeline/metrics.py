"""Model-quality metrics: the one implementation used by training validation, the promotion gate,
``fraudctl evaluate`` and the baseline benchmark. Pure functions of numpy arrays.

Conventions: ``labels`` are 0/1, ``scores`` are probabilities (or any monotone score where only
ranking matters). Degenerate inputs (one class only, empty) return NaN rather than raising, so a
caller can decide ("insufficient evidence") instead of crashing.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve


def _arrays(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.int64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    return y, s


def _has_both_classes(y: np.ndarray) -> bool:
    return y.size > 0 and 0 < int(y.sum()) < y.size


def auc_roc(labels, scores) -> float:
    y, s = _arrays(labels, scores)
    return float(roc_auc_score(y, s)) if _has_both_classes(y) else float("nan")


def average_precision(labels, scores) -> float:
    """Area under the precision-recall curve (step-wise, as scikit-learn defines it)."""
    y, s = _arrays(labels, scores)
    return float(average_precision_score(y, s)) if _has_both_classes(y) else float("nan")


def recall_at_fpr(labels, scores, max_fpr: float = 0.01) -> float:
    """Highest recall (TPR) reachable with a threshold whose false-positive rate is <= ``max_fpr``."""
    y, s = _arrays(labels, scores)
    if not _has_both_classes(y):
        return float("nan")
    fpr, tpr, _ = roc_curve(y, s)
    return float(tpr[fpr <= max_fpr].max())


def card_precision_at_k(labels, scores, card_ids, days, k: int = 100) -> float:
    """Mean over days of the share of fraudulent cards among the ``k`` highest-scored cards of that day.

    A card's daily score is its highest transaction score that day; a card is fraudulent that day
    if any of its transactions that day is fraud. Days with fewer than ``k`` cards use all cards
    but still divide by ``k`` (as in the fraud-detection literature: an investigator has k slots).
    """
    y, s = _arrays(labels, scores)
    cards = np.asarray(card_ids).ravel()
    day = np.asarray(days).ravel()
    if y.size == 0:
        return float("nan")
    # Sort by (day, card) so each (day, card) group is contiguous; reduce with ufunc.reduceat.
    order = np.lexsort((cards, day))
    day_o, card_o, y_o, s_o = day[order], cards[order], y[order], s[order]
    new_group = np.ones(y.size, dtype=bool)
    new_group[1:] = (day_o[1:] != day_o[:-1]) | (card_o[1:] != card_o[:-1])
    starts = np.flatnonzero(new_group)
    g_day = day_o[starts]
    g_score = np.maximum.reduceat(s_o, starts)
    g_fraud = np.maximum.reduceat(y_o, starts)
    precisions = []
    for d in np.unique(g_day):
        mask = g_day == d
        top = np.argsort(-g_score[mask], kind="stable")[:k]
        precisions.append(g_fraud[mask][top].sum() / k)
    return float(np.mean(precisions))


def expected_calibration_error(labels, scores, bins: int = 15) -> float:
    """ECE with equal-width probability bins: sum_b (n_b / n) * |mean(y_b) - mean(p_b)|."""
    y, p = _arrays(labels, scores)
    if y.size == 0:
        return float("nan")
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    counts = np.bincount(idx, minlength=bins)
    sum_y = np.bincount(idx, weights=y, minlength=bins)
    sum_p = np.bincount(idx, weights=p, minlength=bins)
    nonzero = counts > 0
    gap = np.abs(sum_y[nonzero] - sum_p[nonzero])  # = n_b * |mean(y_b) - mean(p_b)|
    return float(gap.sum() / y.size)


def population_stability_index(reference, current, bins: int = 10, eps: float = 1e-6) -> float:
    """PSI of ``current`` scores against ``reference`` scores, bins at the reference's quantiles."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    cur = np.asarray(current, dtype=np.float64).ravel()
    if ref.size == 0 or cur.size == 0:
        return float("nan")
    edges = np.unique(np.quantile(ref, np.linspace(0, 1, bins + 1)[1:-1]))
    ref_share = np.bincount(np.searchsorted(edges, ref, side="right"), minlength=edges.size + 1) / ref.size
    cur_share = np.bincount(np.searchsorted(edges, cur, side="right"), minlength=edges.size + 1) / cur.size
    ref_share = np.clip(ref_share, eps, None)
    cur_share = np.clip(cur_share, eps, None)
    return float(np.sum((cur_share - ref_share) * np.log(cur_share / ref_share)))


def classification_report(labels, scores, card_ids=None, days=None) -> dict[str, float]:
    """The standard metric set, as logged per epoch and printed by ``fraudctl evaluate``."""
    y, s = _arrays(labels, scores)
    report = {
        "auc_roc": auc_roc(y, s),
        "average_precision": average_precision(y, s),
        "recall_at_1pct_fpr": recall_at_fpr(y, s, 0.01),
        "ece": expected_calibration_error(y, s),
        "n": int(y.size),
        "n_fraud": int(y.sum()),
    }
    if card_ids is not None and days is not None:
        report["card_precision_at_100"] = card_precision_at_k(y, s, card_ids, days, 100)
    return report
