"""Model-quality metrics: the one implementation used by training validation, the promotion gate,
``fraudctl evaluate`` and the baseline benchmark. Pure functions of numpy arrays.

Conventions: ``labels`` are 0/1, ``scores`` are probabilities (or any monotone score where only
ranking matters). Degenerate inputs (one class only, empty) return NaN rather than raising, so a
caller can decide ("insufficient evidence") instead of crashing.

Two models scored on the same rows are compared with paired intervals (:class:`PairedDifference`):
DeLong for AUC-ROC, a bootstrap for any metric here with a weighted form; both optionally by cluster
(the card), because rows of one card are not independent evidence.

Budget metrics (:func:`recall_at_rate`, :func:`precision_at_rate`) flag the top ``rate`` share of the
rows by score, what a review team with that capacity works through. A tie group straddling the cut
is flagged in part, in proportion to the places left, so ties neither help nor hurt a model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Literal, get_args

import numpy as np
import pandas as pd
from scipy import sparse
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

PSI_RESOLUTION = 1.0  # log-odds: score changes much smaller than this (odds x2.7) do not read as a shift
PSI_GRID_PER_RESOLUTION = 4  # histogram cells per resolution unit


def _arrays(labels, scores) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.int64).ravel()
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.shape[0]} vs {s.shape[0]}")
    return y, s


def _has_both_classes(y: np.ndarray) -> bool:
    return y.size > 0 and 0 < int(y.sum()) < y.size


def auc_roc(labels, scores, sample_weight=None) -> float:
    """AUC-ROC; with ``sample_weight``, each row counts that many times (e.g. ``1 / rate`` for a sampled
    genuine row)."""
    y, s = _arrays(labels, scores)
    return float(roc_auc_score(y, s, sample_weight=sample_weight)) if _has_both_classes(y) else float("nan")


def average_precision(labels, scores, sample_weight=None) -> float:
    """Area under the precision-recall curve (step-wise, as scikit-learn defines it); ``sample_weight``
    as :func:`auc_roc`."""
    y, s = _arrays(labels, scores)
    if not _has_both_classes(y):
        return float("nan")
    return float(average_precision_score(y, s, sample_weight=sample_weight))


def recall_at_fpr(labels, scores, max_fpr: float = 0.01, sample_weight=None) -> float:
    """Highest recall (TPR) reachable with a threshold whose false-positive rate is <= ``max_fpr``;
    ``sample_weight`` as :func:`auc_roc`."""
    y, s = _arrays(labels, scores)
    if not _has_both_classes(y):
        return float("nan")
    fpr, tpr, _ = roc_curve(y, s, sample_weight=sample_weight)
    return float(tpr[fpr <= max_fpr].max())


def _flagged_share(scores: np.ndarray, rate: float) -> np.ndarray:
    """Per row, how much of it the top ``k = rate * n`` rows take: 1 above the cut, 0 below, and for the
    tie group straddling it the share of the group that the remaining places fill."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"a flagged share must be in (0, 1], got {rate}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("budget metrics need finite scores: drop the rows a model could not score first")
    ascending_negated = np.sort(-scores)
    higher = np.searchsorted(ascending_negated, -scores, side="left")  # rows scored strictly higher
    tied = np.searchsorted(ascending_negated, -scores, side="right") - higher  # rows with this score, itself included
    return np.clip((rate * scores.size - higher) / tied, 0.0, 1.0)


def recall_at_rate(labels, scores, rate: float) -> float:
    """Share of the frauds among the top ``rate`` share of rows by score (ties flagged in part).

    NaN without frauds. Raises ValueError for ``rate`` outside (0, 1] or non-finite scores.
    """
    y, s = _arrays(labels, scores)
    flagged = _flagged_share(s, rate)
    frauds = int(y.sum())
    return float(flagged @ y / frauds) if frauds else float("nan")


def precision_at_rate(labels, scores, rate: float) -> float:
    """Share of frauds among the top ``rate`` share of rows by score, i.e. flagged frauds / (rate * n).

    NaN on no rows. Raises ValueError for ``rate`` outside (0, 1] or non-finite scores.
    """
    y, s = _arrays(labels, scores)
    flagged = _flagged_share(s, rate)
    return float(flagged @ y / (rate * y.size)) if y.size else float("nan")


@dataclass(frozen=True)
class DayCardPrecision:
    """One test day of card precision@k; card counts are distinct cards with a payment that day."""

    day: str  # YYYY-MM-DD (UTC)
    cards: int  # ranked: neither known compromised nor detected on an earlier day
    fraud_cards: int  # of the ranked cards, those with a fraud that day
    known_removed: int  # left out: known compromised before the day started
    detected_removed: int  # left out: found in an earlier day's top k
    hits: int  # fraudulent cards among the top k
    precision: float  # hits / k


def card_precision_at_k(labels, scores, card_ids, days, k: int = 100) -> float:
    """Mean over days of :func:`daily_card_precision` (no card known compromised beforehand).

    ``days``: each row's UTC day, as ``YYYY-MM-DD`` strings or ``datetime64[D]``.
    """
    y, s = _arrays(labels, scores)
    if y.size == 0:
        return float("nan")
    day = np.asarray(days).astype("datetime64[D]").astype(np.int64).ravel()
    cards = pd.factorize(np.asarray(card_ids).ravel(), sort=True)[0].astype(np.int64)
    daily = daily_card_precision(day, cards, s, y.astype(np.int64), np.zeros(y.size, dtype=bool), k)
    return float(np.mean([d.precision for d in daily]))


def daily_card_precision(day: np.ndarray, cards: np.ndarray, scores: np.ndarray, labels: np.ndarray,
                         known: np.ndarray, k: int) -> tuple[DayCardPrecision, ...]:
    """Card precision@k per test day, oldest first (one row per transaction in, per day out).

    ``day``: UTC day number (days since 1970-01-01); ``cards``: integer card codes ordered like the
    card ids (ties in score go to the smaller code, so the ranking is deterministic); ``known``:
    the row's card is known compromised that day.
    """
    groups = (pd.DataFrame({"day": day, "card": cards, "score": scores, "fraud": labels, "known": known})
              .groupby(["day", "card"], sort=True).max())
    g_day = groups.index.get_level_values("day").to_numpy()
    g_card = groups.index.get_level_values("card").to_numpy()
    g_score, g_fraud, g_known = (groups[c].to_numpy() for c in ("score", "fraud", "known"))
    detected = np.zeros(int(cards.max()) + 1 if cards.size else 0, dtype=bool)
    out = []
    bounds = np.flatnonzero(np.diff(g_day, prepend=g_day[:1] - 1, append=g_day[-1:] + 1))
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        day_cards, day_known = g_card[lo:hi], g_known[lo:hi]
        earlier = detected[day_cards] & ~day_known
        ranked = ~day_known & ~earlier
        top = np.argsort(-g_score[lo:hi][ranked], kind="stable")[:k]
        top_fraud = g_fraud[lo:hi][ranked][top] == 1
        detected[day_cards[ranked][top][top_fraud]] = True
        out.append(DayCardPrecision(
            day=str(np.datetime64(int(g_day[lo]), "D")), cards=int(ranked.sum()),
            fraud_cards=int(g_fraud[lo:hi][ranked].sum()), known_removed=int(day_known.sum()),
            detected_removed=int(earlier.sum()), hits=int(top_fraud.sum()), precision=float(top_fraud.sum() / k),
        ))
    return tuple(out)


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


@dataclass(frozen=True)
class CalibrationBin:
    """One bin of a calibration curve: scores in ``[lower, upper)`` (the last bin includes 1)."""

    lower: float
    upper: float
    n: int
    mean_score: float
    fraud_rate: float


def calibration_curve(labels, scores, bins: int = 15) -> tuple[CalibrationBin, ...]:
    """The reliability diagram behind :func:`expected_calibration_error`, on the same equal-width
    bins: per non-empty bin, lowest first, its rows, mean score and fraud rate, so that
    ECE = sum_b (n_b / n) * |fraud_rate_b - mean_score_b|. Empty input -> no bins."""
    y, p = _arrays(labels, scores)
    idx = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    counts = np.bincount(idx, minlength=bins)
    sum_y = np.bincount(idx, weights=y, minlength=bins)
    sum_p = np.bincount(idx, weights=p, minlength=bins)
    return tuple(CalibrationBin(lower=b / bins, upper=(b + 1) / bins, n=int(counts[b]),
                                mean_score=float(sum_p[b] / counts[b]), fraud_rate=float(sum_y[b] / counts[b]))
                 for b in np.flatnonzero(counts))


# --- Paired comparison of two models scored on the same rows -------------------------------------


@dataclass(frozen=True)
class PairedDifference:
    """``metric(a) - metric(b)`` on the same rows, with a two-sided ``confidence`` interval.

    ``method`` says how the interval was obtained (``delong``, ``delong-clustered``, ``bootstrap``,
    ``bootstrap-clustered``); ``units`` is the number of independent units behind it: rows, or
    clusters for the ``-clustered`` methods.
    All NaN when the metric is undefined (one class only) or there is too little data for an interval.
    """

    estimate: float
    lower: float
    upper: float
    confidence: float
    method: str
    units: int

    def to_dict(self) -> dict[str, float | str | int]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> PairedDifference:
        """Inverse of :meth:`to_dict`, also after a JSON round trip that stored NaN as null."""
        bounds = {k: float("nan") if d[k] is None else float(d[k]) for k in ("estimate", "lower", "upper")}
        return PairedDifference(**bounds, confidence=float(d["confidence"]), method=str(d["method"]),
                                units=int(d["units"]))


def _normal_interval(estimate: float, variance: float, confidence: float) -> tuple[float, float]:
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(variance)
    return estimate - half, estimate + half


def wilson_upper_bound(successes: int, trials: int, confidence: float) -> float:
    """One-sided upper confidence bound of a binomial rate (Wilson score interval): with probability
    ``confidence`` the true rate is at or below it, given ``successes`` of ``trials``. 1.0 for no trials.

    Unlike the normal approximation it stays inside [0, 1] and is sound for the tens of frauds a
    monitored day holds, and for rates near 0 or 1.
    """
    return _wilson(successes, trials, NormalDist().inv_cdf(confidence))[1]


def wilson_interval(successes: int, trials: int, confidence: float) -> tuple[float, float]:
    """Two-sided ``confidence`` interval of a binomial rate (Wilson score); (0, 1) for no trials."""
    return _wilson(successes, trials, NormalDist().inv_cdf(0.5 + confidence / 2))


def _wilson(successes: int, trials: int, z: float) -> tuple[float, float]:
    if trials <= 0:
        return 0.0, 1.0
    p, n = successes / trials, trials
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - spread) / (1 + z * z / n)), min(1.0, (centre + spread) / (1 + z * z / n))


def binomial_at_most(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
                 + (n - i) * math.log1p(-p) for i in range(min(k, n) + 1)]
    top = max(log_terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in log_terms))


def binomial_upper_bound(successes: int, trials: int, confidence: float) -> float:
    """One-sided exact (Clopper-Pearson) upper confidence bound of a binomial rate: the rate ``p`` at
    which ``successes`` or fewer of ``trials`` has probability ``1 - confidence``; 1.0 for no trials
    or all successes. Unlike Wilson's it holds at the few events a monitored day may have: for 0 of 6
    Wilson gives 0.31 at 95%, while 0 of 6 happens 7% of the time at a rate of 0.36 (exact: 0.39)."""
    if trials <= 0 or successes >= trials:
        return 1.0
    low, high = successes / trials, 1.0
    for _ in range(50):  # bisection: the tail falls as p rises; 2^-50 is far below any reported digit
        mid = (low + high) / 2
        low, high = (mid, high) if binomial_at_most(successes, trials, mid) > 1.0 - confidence else (low, mid)
    return high


def _midranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span (the "fast DeLong" building block)."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]  # exclusive: the group holds ranks starts+1 .. ends
    group = np.repeat(np.arange(starts.size), ends - starts)
    ranks = np.empty(x.size)
    ranks[order] = ((starts + 1 + ends) / 2.0)[group]
    return ranks


def _auc_placements(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's placement values: per positive, the share of negatives scored below it (ties count
    1/2); per negative, the share of positives scored above it. Their means are both the AUC."""
    m, n = int(positive.sum()), int((~positive).sum())
    all_ranks = _midranks(scores)
    below = all_ranks[positive] - _midranks(scores[positive])  # negatives below each positive
    above = all_ranks[~positive] - _midranks(scores[~positive])  # positives below each negative
    return below / n, 1.0 - above / m


def delong_auc_difference(labels, scores_a, scores_b, clusters=None, confidence: float = 0.95) -> PairedDifference:
    """AUC-ROC of ``scores_a`` minus AUC-ROC of ``scores_b`` on the same rows, with DeLong's interval.

    Fast DeLong (Sun & Xu 2014): placement values from midranks, O(n log n). Rows are assumed
    independent unless ``clusters`` (one id per row, e.g. the card) is given: then the variance
    sums placement deviations per cluster first (Obuchowski 1997), because a card's payments are
    scored alike and several frauds on one card are one piece of evidence, not several.
    """
    y, a = _arrays(labels, scores_a)
    _, b = _arrays(labels, scores_b)
    method = "delong" if clusters is None else "delong-clustered"
    nan = float("nan")
    positive = y == 1
    m, n = int(positive.sum()), int((~positive).sum())
    if m < 2 or n < 2:
        return PairedDifference(nan, nan, nan, confidence, method, 0)
    pos_a, neg_a = _auc_placements(a, positive)
    pos_b, neg_b = _auc_placements(b, positive)
    pos_d, neg_d = pos_a - pos_b, neg_a - neg_b  # placements of the difference (the statistic is linear)
    estimate = float(pos_d.mean())
    variance, units = _placement_variance(positive, pos_d, neg_d, estimate, clusters)
    lower, upper = _normal_interval(estimate, variance, confidence)
    return PairedDifference(estimate, lower, upper, confidence, method, units)


def _placement_variance(positive: np.ndarray, pos: np.ndarray, neg: np.ndarray, estimate: float,
                        clusters) -> tuple[float, int]:
    """DeLong's variance of an AUC (or AUC difference) from its placements, and the independent units
    behind it: rows, or ``clusters`` (then deviations are summed per cluster first, Obuchowski 1997)."""
    m, n = int(positive.sum()), int((~positive).sum())
    if clusters is None:
        return pos.var(ddof=1) / m + neg.var(ddof=1) / n, positive.size
    codes = _cluster_codes(clusters, positive.size)
    units = int(codes.max()) + 1
    # Each cluster's contribution to the linearised estimator; var = k/(k-1) * sum of squares.
    per_cluster = (np.bincount(codes[positive], (pos - estimate) / m, minlength=units)
                   + np.bincount(codes[~positive], (neg - estimate) / n, minlength=units))
    return (units / (units - 1) * float(np.sum(per_cluster ** 2)) if units > 1 else float("nan")), units


def auc_with_variance(labels, scores, clusters=None) -> tuple[float, float]:
    """AUC-ROC and DeLong's variance of it (by ``clusters`` when given, as in
    :func:`delong_auc_difference`: a card's frauds are one piece of evidence, not several). NaN for one
    class only or fewer than 2 of either."""
    y, s = _arrays(labels, scores)
    positive = y == 1
    if positive.sum() < 2 or (~positive).sum() < 2:
        return float("nan"), float("nan")
    pos, neg = _auc_placements(s, positive)
    auc = float(pos.mean())
    return auc, _placement_variance(positive, pos, neg, auc, clusters)[0]


def auc_upper_bound(labels, scores, clusters=None, confidence: float = 0.95,
                    between_days: float = 0.0) -> tuple[float, float]:
    """AUC-ROC and its one-sided upper confidence bound: :func:`auc_with_variance` plus ``between_days``,
    the variance a day's AUC has around the model's from one day to the next (another fraud mix, another
    weekday: :func:`between_day_auc_variance`), which no bound within one day sees. With ``confidence``
    0 the bound is the AUC itself. NaN for one class only or fewer than 2 of either."""
    auc, variance = auc_with_variance(labels, scores, clusters)
    if confidence <= 0 or not math.isfinite(auc):
        return auc, auc
    if not math.isfinite(variance):
        return auc, float("nan")
    spread = math.sqrt(max(variance, 0.0) + max(between_days, 0.0))
    return auc, min(1.0, auc + NormalDist().inv_cdf(confidence) * spread)


def between_day_auc_variance(labels, scores, days, clusters=None, min_positives: int = 10) -> float:
    """How much more a day's AUC varies from day to day than its within-day DeLong variance says
    (method of moments over the days of at least ``min_positives`` positives: the variance of their
    AUCs less the mean of their DeLong variances, at least 0; 0 with fewer than 3 such days).
    Measured here: a healthy e-commerce test week's daily AUCs spread by 0.04 where each day's own
    bound allowed 0.035, and one healthy day fell below a within-day 95% bound; that week's validation
    days spread less, so this estimate did not foresee it (the monitor's ranking rule is opt-in)."""
    y, s = _arrays(labels, scores)
    day = np.asarray(days)
    cards = None if clusters is None else np.asarray(clusters)
    aucs, variances = [], []
    for d in np.unique(day):
        rows = day == d
        if y[rows].sum() < min_positives:
            continue
        auc, variance = auc_with_variance(y[rows], s[rows], None if cards is None else cards[rows])
        if math.isfinite(auc) and math.isfinite(variance):
            aucs.append(auc)
            variances.append(variance)
    if len(aucs) < 3:
        return 0.0
    return max(0.0, float(np.var(aucs, ddof=1) - np.mean(variances)))


def _cluster_codes(clusters, n: int) -> np.ndarray:
    ids = np.asarray(clusters).ravel()
    if ids.size != n:
        raise ValueError(f"clusters and labels differ in length: {ids.size} vs {n}")
    return np.unique(ids, return_inverse=True)[1].ravel()


def _unit_codes(clusters, n: int) -> np.ndarray:
    """What a bootstrap draws, per row: its cluster (dense codes), or the row itself without clusters."""
    return np.arange(n) if clusters is None else _cluster_codes(clusters, n)


class _RankedScores:
    """One model's scores sorted once (descending) with their tie groups, so AUC-ROC, average
    precision and the budget metrics can be evaluated for many weightings of the rows (bootstrap
    replicates) without sorting again. A replicate is how many times it drew each unit (``codes``:
    each row's unit, a card or, by default, the row itself): ``replicates x units`` arrays. Every
    metric is a function of the per-score sums (:meth:`per_score`: each replicate's weight of the
    positives and of all rows at each distinct score), and each reads only the scores that decide it:

    * AUC-ROC: all of them;
    * average precision: the score groups that hold a positive (a few hundred among a validation
      day's hundred thousand). Each replicate's weight of the rows ranked down to each such group,
      and of its positives, is one sparse product of the unit counts, where the sums at every score
      spread every replicate over every row;
    * the budget metrics: the top scores down to each replicate's cut (:meth:`budget_metrics`).

    The sums are of whole counts, exact in float64, so each metric equals its dense form but for
    the order average precision adds its terms in (1e-16).
    """

    def __init__(self, labels: np.ndarray, scores: np.ndarray, codes: np.ndarray | None = None) -> None:
        self.order = np.argsort(-scores, kind="mergesort")
        self.labels = labels[self.order].astype(np.float64)
        ordered = scores[self.order]
        new_group = np.r_[True, ordered[1:] != ordered[:-1]] if ordered.size else np.zeros(0, dtype=bool)
        self.starts = np.flatnonzero(new_group)  # first row of each distinct score
        self.codes = np.arange(labels.size) if codes is None else codes
        units = int(self.codes.max()) + 1 if self.codes.size else 0
        # Each positive group collects the sorted rows after the positive group before it, down to
        # its own last row (the rows below the last positive group weigh in no precision).
        group = np.cumsum(new_group) - 1
        positive_groups = np.unique(group[self.labels == 1])
        upto = np.searchsorted(positive_groups, group)
        unit = self.codes[self.order]

        def rows_per_unit(rows: np.ndarray) -> sparse.csr_matrix:  # units x positive groups
            return sparse.csr_matrix((np.ones(rows.size), (unit[rows], upto[rows])),
                                     shape=(units, positive_groups.size))

        self._rows_down_to = rows_per_unit(np.flatnonzero(upto < positive_groups.size))
        self._positives_at = rows_per_unit(np.flatnonzero(self.labels == 1))
        self._unit_rows = np.bincount(self.codes, minlength=units).astype(np.float64)
        self._unit_positives = np.bincount(self.codes, weights=labels.astype(np.float64), minlength=units)

    def per_score(self, unit_counts: np.ndarray, groups: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Weight of positives and of all rows at each distinct score, highest score first (the
        first ``groups`` scores only, if given)."""
        take = self.starts.size if groups is None else groups
        rows = self.order if take == self.starts.size else self.order[:self.starts[take]]
        w = unit_counts[:, self.codes[rows]]
        starts = self.starts[:take]
        return np.add.reduceat(w * self.labels[:rows.size], starts, axis=1), np.add.reduceat(w, starts, axis=1)

    def auc_roc(self, unit_counts: np.ndarray) -> np.ndarray:
        return _auc_of_sums(*self.per_score(unit_counts))

    def average_precision(self, unit_counts: np.ndarray) -> np.ndarray:
        """:func:`_ap_of_sums` of :meth:`per_score` (the same sums of whole counts, exact in float64),
        added over the positive groups only."""
        positives = np.asarray(self._positives_at.T.dot(unit_counts.T)).T
        flagged = np.cumsum(np.asarray(self._rows_down_to.T.dot(unit_counts.T)).T, axis=1)
        return _ap_of_sums(positives, flagged, cumulative=True)

    def budget_metrics(self, unit_counts: np.ndarray, rate: float) -> dict[str, np.ndarray]:
        """``recall_at_rate`` and ``precision_at_rate`` of each replicate flagging its top ``rate``
        share of weight, from one cut (:func:`_flagged_frauds_of_sums`). The cut lies among the top
        scores, so only the fewest top score groups that reach it in every replicate are summed: about
        ``2 * rate`` of the rows, twice as many again while some replicate's cut lies beyond them."""
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"a flagged share must be in (0, 1], got {rate}")
        total = unit_counts @ self._unit_rows  # whole counts: exact, as the sums' own last cumulative
        groups = int(np.searchsorted(self.starts, 2 * rate * self.order.size + 64, side="right"))
        while True:
            groups = min(groups, self.starts.size)
            pos, rows = self.per_score(unit_counts, groups)
            if groups == self.starts.size or bool((rows.sum(axis=1) >= rate * total).all()):
                break
            groups *= 2
        flagged, k = _flagged_frauds_of_sums(pos, rows, rate, total)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"recall_at_rate": flagged / (unit_counts @ self._unit_positives), "precision_at_rate": flagged / k}

    def recall_at_rate(self, unit_counts: np.ndarray, rate: float) -> np.ndarray:
        return self.budget_metrics(unit_counts, rate)["recall_at_rate"]

    def precision_at_rate(self, unit_counts: np.ndarray, rate: float) -> np.ndarray:
        return self.budget_metrics(unit_counts, rate)["precision_at_rate"]

    def metrics(self, names: Sequence[BootstrapMetric], unit_counts: np.ndarray,
                rate: float | None) -> list[np.ndarray]:
        """Each metric of ``names`` (:func:`_check_metrics`) for every replicate of ``unit_counts``;
        the budget metrics share one cut."""
        budget = self.budget_metrics(unit_counts, rate) if set(names) & set(RATE_METRICS) else {}
        whole = {"auc_roc": self.auc_roc, "average_precision": self.average_precision}
        return [budget[name] if name in budget else whole[name](unit_counts) for name in names]


def _auc_of_sums(pos: np.ndarray, rows: np.ndarray) -> np.ndarray:
    neg = rows - pos
    neg_below = neg.sum(axis=1, keepdims=True) - np.cumsum(neg, axis=1)  # ties count 1/2 below
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (neg_below + 0.5 * neg)).sum(axis=1) / (pos.sum(axis=1) * neg.sum(axis=1))


def _ap_of_sums(pos: np.ndarray, rows: np.ndarray, cumulative: bool = False) -> np.ndarray:
    """As scikit-learn defines it: sum over distinct thresholds of recall step x precision.
    ``cumulative``: ``rows`` is already the weight flagged down to each threshold."""
    tp, flagged = np.cumsum(pos, axis=1), (rows if cumulative else np.cumsum(rows, axis=1))
    precision = np.divide(tp, flagged, out=np.zeros_like(tp), where=flagged > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * precision).sum(axis=1) / tp[:, -1]


def _flagged_frauds_of_sums(pos: np.ndarray, rows: np.ndarray, rate: float,
                            total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Fraud weight flagged by the top ``rate`` share of each replicate's weight ``total`` (the tie
    group at the cut in part, as :func:`recall_at_rate`), and that flagged weight ``k``. ``pos`` and
    ``rows``: the per-score sums of the top scores, at least down to every replicate's cut."""
    cum_rows, cum_pos = np.cumsum(rows, axis=1), np.cumsum(pos, axis=1)
    k = rate * total
    # The group at the cut: the first whose cumulative weight reaches k (it holds weight, so no 0/0).
    cut = np.minimum((cum_rows < k[:, None]).sum(axis=1), rows.shape[1] - 1)
    replicate = np.arange(rows.shape[0])
    at_cut_rows, at_cut_pos = rows[replicate, cut], pos[replicate, cut]
    with np.errstate(invalid="ignore", divide="ignore"):
        share = (k - (cum_rows[replicate, cut] - at_cut_rows)) / at_cut_rows
    return cum_pos[replicate, cut] - at_cut_pos + share * at_cut_pos, k


BootstrapMetric = Literal["auc_roc", "average_precision", "recall_at_rate", "precision_at_rate"]
RATE_METRICS = ("recall_at_rate", "precision_at_rate")  # need ``rate``: the flagged share


def _check_metrics(metrics: Sequence[BootstrapMetric], rate: float | None) -> None:
    """Raise before any resampling for a metric the bootstrap has not, or a budget metric without ``rate``."""
    for metric in metrics:
        if metric not in get_args(BootstrapMetric):
            raise ValueError(f"no bootstrap for metric {metric!r}: one of {', '.join(get_args(BootstrapMetric))}")
        if metric in RATE_METRICS and rate is None:
            raise ValueError(f"the bootstrap of {metric} needs the flagged share: pass rate=")


BOOTSTRAP_CELLS = 4_000_000  # replicates x rows weighted at once (a few 32 MB arrays)


def paired_bootstrap_difference(labels, scores_a, scores_b, metric: BootstrapMetric = "average_precision",
                                clusters=None, resamples: int = 1000, confidence: float = 0.95,
                                seed: int = 0, rate: float | None = None) -> PairedDifference:
    """``metric`` of ``scores_a`` minus that of ``scores_b`` on the same rows, with a percentile interval
    from a paired bootstrap: :func:`paired_bootstrap_differences` for one metric."""
    return paired_bootstrap_differences(labels, scores_a, scores_b, (metric,), clusters, resamples, confidence,
                                        seed, rate)[0]


def paired_bootstrap_differences(labels, scores_a, scores_b, metrics: Sequence[BootstrapMetric],
                                 clusters=None, resamples: int = 1000, confidence: float = 0.95,
                                 seed: int = 0, rate: float | None = None) -> tuple[PairedDifference, ...]:
    """Per metric of ``metrics`` (``auc_roc``, ``average_precision``, ``recall_at_rate``,
    ``precision_at_rate``; the last two at flagged share ``rate``), that metric of ``scores_a`` minus
    that of ``scores_b`` on the same rows, with a percentile interval from one paired bootstrap.

    Each replicate draws whole clusters (``clusters``: one id per row, e.g. the card) or rows with
    replacement, and scores both models on the same draw, so what the models share cancels out.
    Every metric is judged on the same replicates, and a metric's intervals do not depend on which
    others are asked for. A replicate is how many times it drew each cluster (or row), so each
    model's scores are sorted once, not once per replicate, and average precision and the budget
    metrics read only the scores that decide them (:class:`_RankedScores`: 500 card resamples of
    108k rows in 0.13 s where weighting every row took 5.7 s). Deterministic for a given ``seed``.
    A metric's replicates where it is undefined (no positive drawn) are dropped; its interval is NaN
    when more than half are.
    """
    y, a = _arrays(labels, scores_a)
    _, b = _arrays(labels, scores_b)
    _check_metrics(metrics, rate)
    codes = _unit_codes(clusters, y.size)
    ranked = (_RankedScores(y, a, codes), _RankedScores(y, b, codes))

    def differences(unit_counts: np.ndarray) -> list[np.ndarray]:
        of_a, of_b = (r.metrics(metrics, unit_counts, rate) for r in ranked)
        return [x - z for x, z in zip(of_a, of_b, strict=True)]

    return _bootstrap(y, differences, len(metrics), codes, clusters is not None, resamples, confidence, seed)


def bootstrap_intervals(labels, scores, metrics: Sequence[BootstrapMetric], clusters=None, resamples: int = 1000,
                        confidence: float = 0.95, seed: int = 0, rate: float | None = None
                        ) -> tuple[PairedDifference, ...]:
    """Per metric of ``metrics``, that metric of one model's ``scores`` with a percentile interval from
    the bootstrap :func:`paired_bootstrap_differences` uses (the same draws for the same ``seed`` and
    ``clusters``), in the same record; its ``estimate`` is the metric itself, not a difference.

    What a model's holdout figure promises for later days of the same portfolio: the gate's
    ``recall_at_budget`` with the interval live recall is judged against.
    """
    y, s = _arrays(labels, scores)
    _check_metrics(metrics, rate)
    codes = _unit_codes(clusters, y.size)
    ranked = _RankedScores(y, s, codes)
    return _bootstrap(y, lambda unit_counts: ranked.metrics(metrics, unit_counts, rate), len(metrics), codes,
                      clusters is not None, resamples, confidence, seed)


def _bootstrap(y: np.ndarray, statistics: Callable[[np.ndarray], list[np.ndarray]], count: int, codes: np.ndarray,
               clustered: bool, resamples: int, confidence: float, seed: int) -> tuple[PairedDifference, ...]:
    """``count`` statistics of the rows with percentile intervals over ``resamples`` draws of whole
    units (``codes``: each row's, a cluster or the row itself). ``statistics`` maps replicates' unit
    counts (``replicates x units``: how many times each unit was drawn) to one array per statistic."""
    method = "bootstrap-clustered" if clustered else "bootstrap"
    units = int(codes.max()) + 1 if codes.size else 0
    nan = float("nan")
    if not _has_both_classes(y):
        return tuple(PairedDifference(nan, nan, nan, confidence, method, units) for _ in range(count))
    estimates = [float(d[0]) for d in statistics(np.ones((1, units)))]
    rng = np.random.default_rng(seed)
    batch = max(1, BOOTSTRAP_CELLS // max(y.size, units))
    replicates: list[list[np.ndarray]] = [[] for _ in range(count)]
    for done in range(0, resamples, batch):
        size = min(batch, resamples - done)
        draws = rng.integers(0, units, size=(size, units)) + units * np.arange(size)[:, None]
        counts = np.bincount(draws.ravel(), minlength=size * units).reshape(size, units)
        for out, d in zip(replicates, statistics(counts.astype(np.float64)), strict=True):
            out.append(d)
    return tuple(_percentile_interval(est, np.concatenate(d), resamples, confidence, method, units)
                 for est, d in zip(estimates, replicates, strict=True))


def _percentile_interval(estimate: float, diffs: np.ndarray, resamples: int, confidence: float, method: str,
                         units: int) -> PairedDifference:
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size * 2 < resamples:
        return PairedDifference(estimate, float("nan"), float("nan"), confidence, method, units)
    lower, upper = np.quantile(diffs, [(1 - confidence) / 2, (1 + confidence) / 2])
    return PairedDifference(estimate, float(lower), float(upper), confidence, method, units)


def population_stability_index(reference, current, resolution: float = PSI_RESOLUTION, eps: float = 1e-6) -> float:
    """PSI of ``current`` probability scores against ``reference`` ones: sum_b (c_b - r_b) ln(c_b / r_b).

    Shares come from each side's log-odds, linearly binned on a grid ``resolution / 4`` wide and
    smoothed with a Gaussian of standard deviation ``resolution``. Not the reference's quantiles: a fraud
    model piles most payments just above zero, quantile edges land inside the pile, and a shift
    of that pile too small to matter moves it across an edge (PSI 2.4 between models with AUC 0.9976
    and 0.9977). With a fixed log-odds grid a bin is the same ratio of risk wherever it lies, and the
    smoothing makes PSI grow continuously with a shift instead of jumping when a narrow pile crosses
    a bin edge. A share p of the scores, spread s in log-odds and shifted by d, scores about
    p * d^2 / (s^2 + resolution^2): a narrow pile counts as ``resolution`` wide, a broad distribution
    keeps the usual PSI of about (d / s)^2. Shares below ``eps``
    are raised to it, so a bin empty on one side gives a finite term.
    Scores must be probabilities in [0, 1] without NaN (drop those first); empty input -> NaN.
    """
    ref = _logit(_probabilities(reference))
    cur = _logit(_probabilities(current))
    if ref.size == 0 or cur.size == 0:
        return float("nan")
    step = resolution / PSI_GRID_PER_RESOLUTION
    reach = 4 * PSI_GRID_PER_RESOLUTION  # kernel half-width in grid steps: 4 standard deviations
    low = min(ref.min(), cur.min()) - reach * step
    cells = int(np.ceil((max(ref.max(), cur.max()) - low) / step)) + reach + 2
    kernel = np.exp(-0.5 * (np.arange(-reach, reach + 1) / PSI_GRID_PER_RESOLUTION) ** 2)

    def shares(logits: np.ndarray) -> np.ndarray:
        # Linear binning: a score splits its weight between the two nearest grid points, so the
        # histogram, and PSI, move continuously with the scores (no jump at a cell edge).
        position = (logits - low) / step
        left = np.floor(position).astype(np.int64)
        right_share = position - left
        counts = (np.bincount(left, 1.0 - right_share, minlength=cells)
                  + np.bincount(left + 1, right_share, minlength=cells))
        smoothed = np.convolve(counts, kernel, mode="same")
        return np.clip(smoothed / smoothed.sum(), eps, None)

    ref_share, cur_share = shares(ref), shares(cur)
    return float(np.sum((cur_share - ref_share) * np.log(cur_share / ref_share)))


def _probabilities(scores) -> np.ndarray:
    p = np.asarray(scores, dtype=np.float64).ravel()
    if p.size and not (np.all(p >= 0.0) and np.all(p <= 1.0)):  # also false for NaN
        raise ValueError("PSI needs probability scores in [0, 1] without NaN")
    return p


def _logit(p: np.ndarray) -> np.ndarray:
    # Clipping keeps exact 0 and 1 finite: they land in the outermost bins (|log-odds| ~ 27.6).
    p = np.clip(p, 1e-12, 1.0 - 1e-12)
    return np.log(p) - np.log1p(-p)


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
