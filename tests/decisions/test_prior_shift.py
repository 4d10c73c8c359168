"""Prior-shift correction: the Bayes adjustment against hand-computed values, EM recovering a known
prior from scores of a calibrated model, and the nightly schedule using only earlier days."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.decisions.prior_shift import (
    adjust_to_prior,
    estimate_prior,
    prior_corrected_scores,
    trailing_priors,
)
from pipeline.metrics import expected_calibration_error


def test_the_adjustment_multiplies_the_odds_by_the_prior_odds_ratio() -> None:
    # p = 0.5 (odds 1), prior 0.1 -> 0.2: odds x (0.2/0.8)/(0.1/0.9) = 2.25 -> 2.25/3.25.
    assert adjust_to_prior([0.5], 0.1, 0.2)[0] == pytest.approx(2.25 / 3.25)
    # p = 0.1 (odds 1/9), prior 0.05 -> 0.025: odds x (0.025/0.975)/(0.05/0.95) = 0.487179...
    ratio = (0.025 / 0.975) / (0.05 / 0.95)
    assert adjust_to_prior([0.1], 0.05, 0.025)[0] == pytest.approx(ratio / 9 / (1 + ratio / 9))
    np.testing.assert_allclose(adjust_to_prior([0.0, 0.3, 1.0], 0.04, 0.04), [0.0, 0.3, 1.0])
    np.testing.assert_array_equal(adjust_to_prior([0.0, 1.0], 0.04, 0.2), [0.0, 1.0])
    shifted = adjust_to_prior([0.01, 0.2, 0.7], 0.04, 0.1)
    assert np.all(np.diff(shifted) > 0) and np.all(shifted > [0.01, 0.2, 0.7])  # order kept, all raised


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match="source_prior"):
        adjust_to_prior([0.5], 0.0, 0.1)
    with pytest.raises(ValueError, match="target_prior"):
        adjust_to_prior([0.5], 0.1, 1.0)
    with pytest.raises(ValueError, match="probabilities"):
        estimate_prior([0.5, np.nan], 0.1)
    with pytest.raises(ValueError, match="lookback_days"):
        trailing_priors(["2026-01-01"], [0.5], 0.1, 0)


def test_em_on_hand_computed_cases() -> None:
    plain = {"prior_strength": 0.0}  # maximum likelihood, as Saerens et al.
    # Scores that are certain leave nothing to adjust: the prior is the share of ones, in one step.
    assert estimate_prior([1.0, 0.0, 0.0, 0.0], 0.5, **plain) == pytest.approx(0.25)
    # Scores at the source prior's mean are its fixed point: no evidence of a shift, no move.
    assert estimate_prior([0.9, 0.1], 0.5, **plain) == pytest.approx(0.5)
    assert estimate_prior([], 0.07) == 0.07
    # The cap: a quarter is odds 1/3, within 4x of even odds but not within 2x.
    assert estimate_prior([1.0, 0.0, 0.0, 0.0], 0.5, max_odds_ratio=2.0, **plain) == pytest.approx(1 / 3)
    # The source prior as 20 expected frauds: 30 certain frauds in 1000 rows at a source prior of 1%
    # give (30 + 20) / (1000 + 20 / 0.01), not 30 / 1000.
    certain = np.r_[np.ones(30), np.zeros(970)]
    assert estimate_prior(certain, 0.01, prior_strength=20.0) == pytest.approx(50 / 3000)
    assert estimate_prior(certain, 0.01, **plain) == pytest.approx(0.03)


def test_little_evidence_moves_the_prior_little_and_none_not_at_all() -> None:
    _, few = _calibrated_sample(np.random.default_rng(4), 300, 0.15, source_prior=0.05)  # ~15 expected frauds
    assert 0.05 < estimate_prior(few, 0.05) < 0.5 * (0.05 + estimate_prior(few, 0.05, prior_strength=0.0))
    # Scores that do not rank leave the prior unidentified: every score above the source prior runs
    # plain EM to 1, which is no estimate; held by the source prior's weight, it stops at the cap.
    assert estimate_prior(np.full(10_000, 0.06), 0.05, prior_strength=0.0) == 0.05
    four_times_odds = 4 * 0.05 / 0.95
    assert estimate_prior(np.full(10_000, 0.06), 0.05) == pytest.approx(four_times_odds / (1 + four_times_odds))
    # Certain scores are evidence enough; a move beyond 4x in odds is capped there.
    certain = np.r_[np.ones(30), np.zeros(10_000)]
    assert estimate_prior(certain, 0.05, max_odds_ratio=100.0, prior_strength=0.0) == pytest.approx(30 / 10_030)
    quarter_odds = 0.05 / 0.95 / 4
    assert estimate_prior(certain, 0.05) == pytest.approx(quarter_odds / (1 + quarter_odds))


def _calibrated_sample(rng: np.random.Generator, n: int, prior: float, source_prior: float,
                       separation: float = 2.0) -> tuple[np.ndarray, np.ndarray]:
    """Labels at ``prior`` and the exact posteriors a model calibrated at ``source_prior`` gives them:
    x ~ N(separation, 1) for fraud, N(0, 1) for genuine (a binormal model, AUC ~0.92 at 2.0)."""
    y = rng.random(n) < prior
    x = rng.standard_normal(n) + separation * y
    log_odds = np.log(source_prior / (1 - source_prior)) + separation * x - separation**2 / 2
    return y.astype(int), 1 / (1 + np.exp(-log_odds))


@pytest.mark.parametrize("true_prior", [0.02, 0.05, 0.15])
def test_em_recovers_a_known_prior_from_a_calibrated_models_scores(true_prior: float) -> None:
    y, scores = _calibrated_sample(np.random.default_rng(1), 200_000, true_prior, source_prior=0.05)
    estimate = estimate_prior(scores, 0.05, prior_strength=0.0)
    assert estimate == pytest.approx(y.mean(), rel=0.05)
    if true_prior != 0.05:  # the mean score alone is pulled towards the source prior; EM is not
        assert abs(scores.mean() - y.mean()) > 3 * abs(estimate - y.mean())


def test_the_adjusted_scores_are_calibrated_at_the_new_prior() -> None:
    y, scores = _calibrated_sample(np.random.default_rng(2), 200_000, 0.15, source_prior=0.05)
    adjusted = adjust_to_prior(scores, 0.05, estimate_prior(scores, 0.05))
    assert expected_calibration_error(y, scores) > 0.03
    assert expected_calibration_error(y, adjusted) < 0.005


def test_each_day_uses_only_the_days_before_it() -> None:
    jan1, jan2, jan3, jan10 = (np.datetime64(f"2026-01-{d:02d}") for d in (1, 2, 3, 10))
    days = np.array([jan1, jan1, jan2, jan2, jan3, jan3, jan10])
    scores = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5])
    options = {"prior_strength": 0.0, "max_odds_ratio": 10.0}
    priors = trailing_priors(days, scores, 0.3, lookback_days=7, **options)
    assert priors == pytest.approx({
        jan1: 0.3,  # nothing before it: the source prior
        jan2: 0.5,  # Jan 1: one of two
        jan3: 0.75,  # Jan 1-2: three of four
        jan10: 0.3,  # Jan 3-9 only (Jan 1-2 are too old): two certain genuine run EM to 0, no estimate
    })
    assert trailing_priors(days, scores, 0.3, lookback_days=1, **options)[jan3] == pytest.approx(0.3)  # Jan 2: to 1
    # A day's own scores never move its prior.
    changed = scores.copy()
    changed[2:4] = 0.0
    assert trailing_priors(days, changed, 0.3, 7, **options)[jan2] == priors[jan2]


def test_prior_corrected_scores_apply_each_days_prior() -> None:
    rng = np.random.default_rng(3)
    y1, s1 = _calibrated_sample(rng, 50_000, 0.15, source_prior=0.05)
    y2, s2 = _calibrated_sample(rng, 50_000, 0.15, source_prior=0.05)
    days = np.repeat(np.array(["2026-01-01", "2026-01-02"], "datetime64[D]"), 50_000)
    corrected = prior_corrected_scores(days, np.concatenate([s1, s2]), 0.05, lookback_days=1)
    np.testing.assert_array_equal(corrected[:50_000], s1)  # the first day has no earlier scores
    np.testing.assert_allclose(corrected[50_000:], adjust_to_prior(s2, 0.05, estimate_prior(s1, 0.05)))
    assert expected_calibration_error(y2, corrected[50_000:]) < expected_calibration_error(y2, s2) / 4
