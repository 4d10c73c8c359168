"""Prior-shift correction: calibrated fraud probabilities that stay calibrated when the fraud rate moves.

A model calibrated on validation outputs P(fraud | payment) at validation's fraud rate, the *source
prior* ``pi_s``. When the share of fraud among today's payments moves to ``pi`` (a fraud wave, a
quiet week) while fraud and genuine payments each look as they did (label shift), Bayes' rule gives
the probability at the new prior (Saerens, Latinne & Decaestecker 2002, eq. 2.4)::

    p' = (pi / pi_s) p / ((pi / pi_s) p + ((1 - pi) / (1 - pi_s)) (1 - p))

that is, every log-odds moves by ``logit(pi) - logit(pi_s)``: the ranking (AUC, AP, which payments
fall in a review budget) is unchanged, only the probabilities analysts read move.

``pi`` is estimated without labels, from recent scores alone, by their EM algorithm
(:func:`estimate_prior`): adjust the scores to the current estimate (E step), take their mean as the
next estimate (M step), until it stops moving. Labels mature days to weeks late; recent unlabeled
scores are there the next morning.

EM is the maximum-likelihood estimate when the scores are calibrated, and it amplifies their
errors when they are not; a day of a low-fraud portfolio holds few frauds, and scores that hardly
rank (near-constant) leave the prior unidentified, EM drifting towards 0 or 1. So ``pi_s`` counts
as ``prior_strength`` expected frauds of evidence (a Beta prior on the rate: a handful of recent
frauds moves the estimate a little, hundreds move it all the way), the estimate falls back to
``pi_s`` when EM does not settle inside (0, 1), and a move is capped at ``max_odds_ratio`` in prior
odds: a bigger one says more about the model than about the fraud rate (and is what a monitor
should raise, not what analysts should read).

Served by :mod:`.prior_tracking`: the source prior ``pi_s`` travels with the model version (the
mean of its calibrated validation scores), ``pi`` is estimated per UTC day from the previous days'
live scores, and ``adjust_to_prior(p, pi_s, pi)`` is returned as the probability. Decisions keep
comparing the model's own score with the version's operating points (chosen on its validation
scores): the adjustment is monotone, so adjusting the score and not the thresholds would move the
review volume with every estimate. :func:`prior_corrected_scores`
is that schedule replayed over a scored window (what the baseline bench reports). Pure numpy, no I/O.
"""

from __future__ import annotations

import numpy as np

PRIOR_FLOOR = 1e-6  # estimates are kept in [floor, 1 - floor]: a prior of exactly 0 or 1 cannot be undone
MAX_ITERATIONS = 1000  # calibrated scores of a useful model settle within tens; drifting ones never do
TOLERANCE = 1e-7  # EM stops when the estimate moves less than this
PRIOR_STRENGTH = 20.0  # expected frauds' worth of evidence the source prior counts as
MAX_ODDS_RATIO = 4.0  # the estimate's prior odds stay within this factor of the source prior's


def adjust_to_prior(scores, source_prior: float, target_prior: float) -> np.ndarray:
    """``scores`` (probabilities at ``source_prior``) as probabilities at ``target_prior`` (module
    docstring). Raises ValueError for priors outside (0, 1) or scores outside [0, 1] or NaN."""
    _check_prior(source_prior, "source_prior")
    _check_prior(target_prior, "target_prior")
    return shift_prior(_probabilities(scores), source_prior, target_prior)


def estimate_prior(scores, source_prior: float, *, weights=None, prior_strength: float = PRIOR_STRENGTH,
                   max_odds_ratio: float = MAX_ODDS_RATIO, max_iterations: int = MAX_ITERATIONS,
                   tolerance: float = TOLERANCE) -> float:
    """The fraud rate among the payments behind ``scores`` (calibrated probabilities at ``source_prior``),
    by EM (Saerens et al. 2002) from ``source_prior``. The M step counts ``source_prior`` as
    ``prior_strength`` expected frauds: (sum of adjusted scores + strength) / (rows + strength /
    source_prior), plain EM at strength 0. The result's prior odds are capped within
    ``max_odds_ratio`` of the source's. ``source_prior`` itself (no evidence of a shift) when there
    are no scores, or EM has not settled within ``max_iterations``, or has run to 0 or 1.

    ``weights``: how many payments each score stands for (a histogram's counts, as the live tracker of
    :mod:`.prior_tracking` keeps them); one each when None."""
    p = _probabilities(scores)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if w.shape != p.shape or not np.all(w >= 0):
        raise ValueError(f"weights must be one non-negative count per score, got {w.shape} for {p.shape}")
    _check_prior(source_prior, "source_prior")
    if max_odds_ratio < 1 or prior_strength < 0:
        raise ValueError(f"max_odds_ratio must be >= 1 and prior_strength >= 0, got {max_odds_ratio} and "
                         f"{prior_strength}")
    rows = float(w.sum())
    if rows == 0:
        return source_prior
    pseudo_rows = prior_strength / source_prior
    prior = source_prior
    for _ in range(max_iterations):
        expected_frauds = float(shift_prior(p, source_prior, prior) @ w)
        updated = float(np.clip((expected_frauds + prior_strength) / (rows + pseudo_rows), PRIOR_FLOOR,
                                1.0 - PRIOR_FLOOR))
        if abs(updated - prior) < tolerance:
            inside = PRIOR_FLOOR < updated < 1.0 - PRIOR_FLOOR
            return _cap(updated, source_prior, max_odds_ratio) if inside else source_prior
        prior = updated
    return source_prior


def trailing_priors(days, scores, source_prior: float, lookback_days: int, *,
                    prior_strength: float = PRIOR_STRENGTH,
                    max_odds_ratio: float = MAX_ODDS_RATIO) -> dict[np.datetime64, float]:
    """Per distinct day of ``days`` (one per score; dates or anything ``datetime64[D]`` accepts), the
    prior :func:`estimate_prior` gives from the scores of the ``lookback_days`` days before it, never
    from its own or later ones; a day with no scores in its lookback gets ``source_prior``."""
    if lookback_days < 1:
        raise ValueError(f"lookback_days must be >= 1, got {lookback_days}")
    day = np.asarray(days).astype("datetime64[D]").ravel()
    p = _probabilities(scores)
    if day.shape != p.shape:
        raise ValueError(f"days and scores differ in length: {day.size} vs {p.size}")
    lookback = np.timedelta64(lookback_days, "D")
    return {d: estimate_prior(p[(day < d) & (day >= d - lookback)], source_prior,
                              prior_strength=prior_strength, max_odds_ratio=max_odds_ratio)
            for d in np.unique(day)}


def prior_corrected_scores(days, scores, source_prior: float, lookback_days: int, *,
                           prior_strength: float = PRIOR_STRENGTH,
                           max_odds_ratio: float = MAX_ODDS_RATIO) -> np.ndarray:
    """``scores`` with each day's adjusted to the prior of :func:`trailing_priors`: what a scorer that
    re-estimates the prior every night from the previous ``lookback_days`` days would have served."""
    day = np.asarray(days).astype("datetime64[D]").ravel()
    p = _probabilities(scores)
    out = p.copy()
    priors = trailing_priors(day, p, source_prior, lookback_days, prior_strength=prior_strength,
                             max_odds_ratio=max_odds_ratio)
    for d, prior in priors.items():
        rows = day == d
        out[rows] = adjust_to_prior(p[rows], source_prior, prior)
    return out


def _cap(prior: float, source_prior: float, max_odds_ratio: float) -> float:
    """``prior`` with its odds kept within ``max_odds_ratio`` of ``source_prior``'s."""
    source_odds = source_prior / (1.0 - source_prior)
    odds = min(max(prior / (1.0 - prior), source_odds / max_odds_ratio), source_odds * max_odds_ratio)
    return odds / (1.0 + odds)


def shift_prior(p, source_prior: float, target_prior: float):
    """Bayes' rule for a prior change on probabilities ``p`` (an array, or one float: no numpy call,
    the scoring path's per-payment case); unchecked, see :func:`adjust_to_prior`."""
    fraud = target_prior / source_prior * p
    genuine = (1.0 - target_prior) / (1.0 - source_prior) * (1.0 - p)
    return fraud / (fraud + genuine)


def _probabilities(scores) -> np.ndarray:
    p = np.asarray(scores, dtype=np.float64).ravel()
    if p.size and not (np.all(p >= 0.0) and np.all(p <= 1.0)):  # also false for NaN
        raise ValueError("prior-shift correction needs probabilities in [0, 1] without NaN")
    return p


def _check_prior(prior: float, name: str) -> None:
    if not 0.0 < prior < 1.0:
        raise ValueError(f"{name} must be in (0, 1), got {prior}")
