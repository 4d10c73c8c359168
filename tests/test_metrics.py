"""Metric implementations against hand-computed values, independent reference implementations
(scikit-learn, an O(m*n) DeLong, the bootstrap) and the distributions they must tell apart."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from pipeline import metrics
from pipeline.metrics import (
    CalibrationBin,
    auc_roc,
    auc_upper_bound,
    average_precision,
    between_day_auc_variance,
    binomial_at_most,
    binomial_upper_bound,
    bootstrap_intervals,
    calibration_curve,
    card_precision_at_k,
    classification_report,
    delong_auc_difference,
    expected_calibration_error,
    paired_bootstrap_difference,
    paired_bootstrap_differences,
    population_stability_index,
    precision_at_rate,
    recall_at_fpr,
    recall_at_rate,
    wilson_interval,
    wilson_upper_bound,
)


def test_auc_and_ap_on_a_hand_checked_ranking():
    labels = [1, 0, 1, 0]
    scores = [0.9, 0.8, 0.7, 0.1]
    assert auc_roc(labels, scores) == 0.75  # 3 of 4 (pos, neg) pairs ordered correctly
    assert average_precision(labels, scores) == (1.0 + 2 / 3) / 2


def test_degenerate_inputs_give_nan_not_errors():
    assert math.isnan(auc_roc([0, 0], [0.1, 0.2]))
    assert math.isnan(average_precision([], []))
    assert math.isnan(recall_at_fpr([1, 1], [0.1, 0.2]))


def test_recall_at_fpr_takes_the_best_threshold_within_budget():
    # 100 negatives; 1 negative outranks everything, positives are next: at FPR<=1% all 3 positives are found.
    labels = np.array([0] + [1, 1, 1] + [0] * 99)
    scores = np.array([1.0, 0.9, 0.8, 0.7] + [0.1] * 99)
    assert recall_at_fpr(labels, scores, 0.01) == 1.0
    assert recall_at_fpr(labels, scores, 0.0) == 0.0


# Ten rows: two above a tie group of four holding two frauds, then four below (one fraud): 3 frauds in all.
BUDGET_LABELS = [1, 0, 1, 0, 0, 1, 0, 0, 0, 1]
BUDGET_SCORES = [0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.2, 0.1, 0.1, 0.0]


@pytest.mark.parametrize(("rate", "flagged_frauds"), [
    (0.1, 1.0),  # k = 1: the top row
    (0.2, 1.0),  # k = 2: the top two, no tie touched
    (0.3, 1.5),  # k = 3: one place for the tie group of 4 -> a quarter of its 2 frauds
    (0.45, 2.25),  # k = 4.5: 2.5 places of 4 -> 5/8 of 2 frauds
    (0.6, 3.0),  # k = 6: the whole tie group
    (1.0, 4.0),  # everything
])
def test_budget_metrics_flag_the_top_share_and_split_a_straddling_tie(rate, flagged_frauds):
    k = rate * len(BUDGET_LABELS)
    assert recall_at_rate(BUDGET_LABELS, BUDGET_SCORES, rate) == pytest.approx(flagged_frauds / 4)
    assert precision_at_rate(BUDGET_LABELS, BUDGET_SCORES, rate) == pytest.approx(flagged_frauds / k)


def test_a_tie_at_the_cut_neither_helps_nor_hurts():
    """A tie group counts as its average over every order the tie could be broken in."""
    labels = np.array([1, 0, 0, 1, 0])
    tied = np.array([0.9, 0.5, 0.5, 0.5, 0.1])  # rows 1-3 tie; the fraud among them is row 3
    orders = list(itertools.permutations([1, 2, 3]))
    for rate in (0.4, 0.6):
        broken = []
        for order in orders:
            scores = tied.copy()
            scores[list(order)] += [0.03, 0.02, 0.01]  # first in ``order`` ranks highest
            broken.append((recall_at_rate(labels, scores, rate), precision_at_rate(labels, scores, rate)))
        assert recall_at_rate(labels, tied, rate) == pytest.approx(np.mean([r for r, _ in broken]))
        assert precision_at_rate(labels, tied, rate) == pytest.approx(np.mean([p for _, p in broken]))
    assert recall_at_rate(labels, tied, 0.4) == pytest.approx((1 + 1 / 3) / 2)  # k = 2: 1 of 3 places


def test_budget_metrics_are_undefined_without_frauds_or_rows_and_refuse_bad_input():
    assert math.isnan(recall_at_rate([0, 0, 0], [0.3, 0.2, 0.1], 0.5))
    assert precision_at_rate([0, 0, 0], [0.3, 0.2, 0.1], 0.5) == 0.0
    assert math.isnan(recall_at_rate([], [], 0.5)) and math.isnan(precision_at_rate([], [], 0.5))
    for rate in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match=r"\(0, 1\]"):
            recall_at_rate(BUDGET_LABELS, BUDGET_SCORES, rate)
    with pytest.raises(ValueError, match="finite scores"):
        precision_at_rate([1, 0], [0.5, float("nan")], 0.5)


def test_card_precision_groups_by_card_and_day():
    # Day 1: card a (fraud) top, card b genuine; day 2: card c genuine top, d fraud second.
    labels = [1, 0, 0, 0, 1]
    scores = [0.9, 0.1, 0.8, 0.95, 0.5]
    cards = ["a", "a", "b", "c", "d"]
    days = [1, 1, 1, 2, 2]
    assert card_precision_at_k(labels, scores, cards, days, k=1) == (1.0 + 0.0) / 2
    assert card_precision_at_k(labels, scores, cards, days, k=2) == (0.5 + 0.5) / 2


def test_ece_is_zero_when_calibrated_and_large_when_not():
    labels = np.array([0, 0, 1, 1])
    assert expected_calibration_error(labels, np.array([0.0, 0.0, 0.99, 0.99]), bins=10) < 0.011
    assert expected_calibration_error(labels, np.array([0.99, 0.99, 0.0, 0.0]), bins=10) > 0.98


def test_calibration_curve_on_hand_computed_bins():
    labels = [0, 0, 1, 0, 1, 1]
    scores = [0.05, 0.15, 0.12, 0.55, 0.95, 1.0]  # bins of 0.25: [0, .25) x3, [.5, .75) x1, [.75, 1] x2
    curve = calibration_curve(labels, scores, bins=4)
    assert curve == (
        CalibrationBin(lower=0.0, upper=0.25, n=3, mean_score=pytest.approx(0.32 / 3), fraud_rate=pytest.approx(1 / 3)),
        CalibrationBin(lower=0.5, upper=0.75, n=1, mean_score=0.55, fraud_rate=0.0),
        CalibrationBin(lower=0.75, upper=1.0, n=2, mean_score=pytest.approx(0.975), fraud_rate=1.0),
    )
    assert calibration_curve([], [], bins=4) == ()


def test_calibration_curve_is_the_decomposition_of_ece():
    rng = np.random.default_rng(3)
    scores = rng.beta(0.5, 4.0, 5000)
    labels = (rng.random(5000) < np.clip(scores * 1.3, 0, 1)).astype(int)  # under-confident scores
    curve = calibration_curve(labels, scores)
    assert sum(b.n for b in curve) == 5000
    ece = sum(b.n / 5000 * abs(b.fraud_rate - b.mean_score) for b in curve)
    assert ece == pytest.approx(expected_calibration_error(labels, scores))
    assert all(b.fraud_rate > b.mean_score for b in curve if b.n > 200)  # the curve shows which way it is off


def test_psi_zero_for_same_distribution_and_grows_with_shift():
    rng = np.random.default_rng(0)
    ref = rng.random(20_000)
    assert population_stability_index(ref, rng.random(20_000)) < 0.01
    assert population_stability_index(ref, rng.random(20_000) ** 3) > 0.5


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_psi_reads_a_bulk_shift_on_the_log_odds_scale():
    """A calibrated fraud model's scores: log-odds around -5 (p ~ 0.7%), spread 1.5."""
    rng = np.random.default_rng(1)
    logits = rng.normal(-5.0, 1.5, 20_000)
    same = rng.normal(-5.0, 1.5, 20_000)
    assert population_stability_index(sigmoid(logits), sigmoid(logits)) == pytest.approx(0.0, abs=1e-12)
    assert population_stability_index(sigmoid(logits), sigmoid(same)) < 0.01
    slight = population_stability_index(sigmoid(logits), sigmoid(same + 0.3))  # odds x1.35
    clear = population_stability_index(sigmoid(logits), sigmoid(same + 1.2))  # odds x3.3
    assert 0.01 < slight < 0.1 < 0.25 < clear


PILE_LOGIT = math.log(1e-4 / (1 - 1e-4))


def piled_scores(rng, n=20_000, pile_logit=PILE_LOGIT, spread=0.05):
    """90% of scores piled at ~1e-4 (the genuine bulk), 10% spread over the risky range."""
    k = int(0.9 * n)
    return np.r_[pile_logit + rng.normal(0.0, spread, k), rng.normal(-2.0, 2.5, n - k)]


def test_psi_of_near_identical_models_with_piled_scores_is_small():
    rng = np.random.default_rng(2)
    champion = piled_scores(rng)
    challenger = champion + rng.normal(0.0, 0.2, champion.size)  # every score within ~20% of the champion's
    assert population_stability_index(sigmoid(champion), sigmoid(challenger)) < 0.02


def test_psi_of_a_moved_pile_grows_smoothly_wherever_the_pile_sits():
    """No bin edge may sit on the pile: the same move scores the same wherever the pile is."""
    rng = np.random.default_rng(3)
    for shift, low, high in ((0.2, 0.01, 0.1), (1.5, 0.5, 5.0)):
        psis = []
        for pile in np.linspace(-9.5, -9.0, 6):  # across a whole log-odds unit's worth of grid offsets
            scores = piled_scores(rng, pile_logit=pile, spread=0.01)
            moved = scores.copy()
            moved[: int(0.9 * scores.size)] += shift
            psis.append(population_stability_index(sigmoid(scores), sigmoid(moved)))
        assert low < min(psis) and max(psis) < high and max(psis) < 1.2 * min(psis), (shift, psis)


def test_psi_rejects_scores_that_are_not_probabilities():
    with pytest.raises(ValueError, match="probability"):
        population_stability_index([0.1, float("nan")], [0.2, 0.3])
    with pytest.raises(ValueError, match="probability"):
        population_stability_index([0.1, 0.2], [1.5, 0.3])
    assert math.isnan(population_stability_index([], [0.2]))


def two_models(rng, n=3000, fraud_rate=0.05, round_to=1):
    """Labels and two correlated, tied (rounded) scores of unequal quality on the same rows."""
    y = (rng.random(n) < fraud_rate).astype(np.int64)
    a = np.round(rng.normal(0.0, 1.0, n) + 1.2 * y, round_to)
    b = np.round(0.7 * a + rng.normal(0.0, 0.7, n) + 0.3 * y, round_to)
    return y, a, b


def brute_force_delong_variance(y, a, b):
    """DeLong et al. (1988) as written: placements from all m x n pairs, ties count 1/2."""
    pos, neg = y == 1, y == 0

    def placements(s):
        wins = (s[pos][:, None] > s[neg][None, :]) + 0.5 * (s[pos][:, None] == s[neg][None, :])
        return wins.mean(axis=1), wins.mean(axis=0)

    (pa, na), (pb, nb) = placements(a), placements(b)
    return np.var(pa - pb, ddof=1) / pos.sum() + np.var(na - nb, ddof=1) / neg.sum()


def half_width(diff):
    return (diff.upper - diff.lower) / 2


def test_fast_delong_equals_the_pairwise_definition_with_ties():
    y, a, b = two_models(np.random.default_rng(4), n=600)
    diff = delong_auc_difference(y, a, b, confidence=0.95)
    assert diff.estimate == pytest.approx(roc_auc_score(y, a) - roc_auc_score(y, b), abs=1e-12)
    assert half_width(diff) == pytest.approx(1.959964 * math.sqrt(brute_force_delong_variance(y, a, b)), rel=1e-6)
    assert (diff.method, diff.units) == ("delong", 600)


def test_delong_interval_agrees_with_a_paired_bootstrap():
    y, a, b = two_models(np.random.default_rng(5))
    delong = delong_auc_difference(y, a, b)
    boot = paired_bootstrap_difference(y, a, b, "auc_roc", resamples=2000, seed=1)
    assert boot.estimate == pytest.approx(delong.estimate, abs=1e-12)
    assert half_width(boot) == pytest.approx(half_width(delong), rel=0.1)
    assert not delong.lower <= 0 <= delong.upper  # a real difference: the data must not make this trivial


def card_clustered_models(rng, cards=400, per_card=8):
    """Frauds come in bursts on compromised cards, and each model misjudges a whole card at once:
    the rows of one card are not independent evidence about the difference of the models."""
    card = np.repeat(np.arange(cards), per_card)
    compromised = rng.random(cards) < 0.08
    y = (compromised[card] & (rng.random(card.size) < 0.7)).astype(np.int64)
    a = 1.5 * y + rng.normal(0.0, 1.0, cards)[card] + rng.normal(0.0, 0.5, card.size)
    b = 1.5 * y + rng.normal(0.0, 1.0, cards)[card] + rng.normal(0.0, 0.5, card.size)
    return y, a, b, card


def test_clustered_delong_agrees_with_a_card_bootstrap_and_is_wider_than_rows():
    y, a, b, card = card_clustered_models(np.random.default_rng(6))
    by_card = delong_auc_difference(y, a, b, clusters=card)
    by_row = delong_auc_difference(y, a, b)
    boot = paired_bootstrap_difference(y, a, b, "auc_roc", clusters=card, resamples=2000, seed=2)
    assert (by_card.method, by_card.units, boot.units) == ("delong-clustered", 400, 400)
    assert half_width(by_card) == pytest.approx(half_width(boot), rel=0.15)
    assert half_width(by_card) > 1.5 * half_width(by_row)


def test_clustering_by_card_undoes_duplicated_rows():
    """Each row copied 5 times under its own card id carries no more evidence than the original."""
    y, a, b = two_models(np.random.default_rng(7), n=1000)
    original = delong_auc_difference(y, a, b)
    copies = [np.repeat(v, 5) for v in (y, a, b)]
    cards = np.repeat(np.arange(y.size), 5)
    assert half_width(delong_auc_difference(*copies, clusters=cards)) == pytest.approx(half_width(original), rel=0.01)
    assert half_width(delong_auc_difference(*copies)) < 0.5 * half_width(original)
    ap_original = paired_bootstrap_difference(y, a, b, resamples=1000, seed=3)
    ap_copies = paired_bootstrap_difference(*copies, clusters=cards, resamples=1000, seed=3)
    assert half_width(ap_copies) == pytest.approx(half_width(ap_original), rel=0.1)


def test_identical_scores_differ_by_exactly_zero():
    y, a, _ = two_models(np.random.default_rng(8))
    for diff in (delong_auc_difference(y, a, a), paired_bootstrap_difference(y, a, a, resamples=200)):
        assert (diff.estimate, diff.lower, diff.upper) == (0.0, 0.0, 0.0)


def test_bootstrap_is_deterministic_for_a_seed_and_matches_sklearn_ap():
    y, a, b = two_models(np.random.default_rng(9))
    first = paired_bootstrap_difference(y, a, b, "average_precision", resamples=300, seed=11)
    assert paired_bootstrap_difference(y, a, b, "average_precision", resamples=300, seed=11) == first
    assert paired_bootstrap_difference(y, a, b, "average_precision", resamples=300, seed=12) != first
    assert first.estimate == pytest.approx(average_precision_score(y, a) - average_precision_score(y, b), abs=1e-12)
    assert first.lower < first.estimate < first.upper


def test_resampling_weights_give_sklearns_weighted_auc_and_ap():
    """A row bootstrap's replicate counts each row's draws; its metrics equal the weighted ones."""
    rng = np.random.default_rng(10)
    y, a, _ = two_models(rng, n=500)
    weights = rng.integers(0, 4, size=(3, y.size)).astype(float)
    ranked = metrics._RankedScores(y, a)
    ap, auc = ranked.average_precision(weights), ranked.auc_roc(weights)
    for i, w in enumerate(weights):
        assert ap[i] == pytest.approx(average_precision_score(y, a, sample_weight=w), abs=1e-12)
        assert auc[i] == pytest.approx(roc_auc_score(y, a, sample_weight=w), abs=1e-12)


def test_resampling_weights_give_the_budget_metrics_of_the_resample():
    """A replicate's weights are counts of drawn rows: equal to the plain metric on the rows repeated
    that often (ties and the fractional cut included), and to it at unit weights."""
    rng = np.random.default_rng(12)
    y, a, _ = two_models(rng, n=400)  # rounded scores: many ties
    weights = rng.integers(0, 4, size=(3, y.size)).astype(float)
    ranked = metrics._RankedScores(y, a)
    for rate in (0.005, 0.05, 0.3):
        unit = np.ones((1, y.size))
        assert ranked.recall_at_rate(unit, rate)[0] == pytest.approx(recall_at_rate(y, a, rate), abs=1e-12)
        assert ranked.precision_at_rate(unit, rate)[0] == pytest.approx(precision_at_rate(y, a, rate), abs=1e-12)
        recall, precision = ranked.recall_at_rate(weights, rate), ranked.precision_at_rate(weights, rate)
        for i, w in enumerate(weights.astype(int)):
            drawn_y, drawn_a = np.repeat(y, w), np.repeat(a, w)
            assert recall[i] == pytest.approx(recall_at_rate(drawn_y, drawn_a, rate), abs=1e-12)
            assert precision[i] == pytest.approx(precision_at_rate(drawn_y, drawn_a, rate), abs=1e-12)


def test_replicates_drawing_whole_cards_give_the_metrics_of_the_rows_they_draw():
    """A replicate counts the draws of each card: average precision, recall and precision at a budget
    equal the plain metrics of the rows repeated as often as their card was drawn, also where the
    replicate drew none of the top-scored cards and its budget's cut lies far down the ranking."""
    rng = np.random.default_rng(14)
    y, a, _, card = card_clustered_models(rng)
    a = np.round(a, 1)  # ties, at the cut too
    codes = np.unique(card, return_inverse=True)[1]
    counts = rng.integers(0, 3, size=(4, codes.max() + 1)).astype(float)
    counts[0, codes[np.argsort(-a)[: a.size // 2]]] = 0  # only cards wholly in the lower half drawn
    ranked = metrics._RankedScores(y, a, codes)
    ap, recall, precision = (ranked.average_precision(counts), ranked.recall_at_rate(counts, 0.05),
                             ranked.precision_at_rate(counts, 0.05))
    for i, drawn in enumerate(counts.astype(int)):
        rows = np.repeat(np.arange(y.size), drawn[codes])
        assert ap[i] == pytest.approx(average_precision_score(y[rows], a[rows]), abs=1e-12)
        assert recall[i] == pytest.approx(recall_at_rate(y[rows], a[rows], 0.05), abs=1e-12)
        assert precision[i] == pytest.approx(precision_at_rate(y[rows], a[rows], 0.05), abs=1e-12)


def test_budget_bootstrap_estimates_the_plain_difference_and_shares_replicates_across_metrics():
    y, a, b, card = card_clustered_models(np.random.default_rng(13))
    ap, recall, precision = paired_bootstrap_differences(
        y, a, b, ("average_precision", "recall_at_rate", "precision_at_rate"), clusters=card, resamples=300,
        seed=4, rate=0.05)
    assert recall.estimate == pytest.approx(recall_at_rate(y, a, 0.05) - recall_at_rate(y, b, 0.05), abs=1e-12)
    assert precision.estimate == pytest.approx(precision_at_rate(y, a, 0.05) - precision_at_rate(y, b, 0.05),
                                               abs=1e-12)
    assert (recall.method, recall.units) == ("bootstrap-clustered", 400)
    assert recall.lower < recall.estimate < recall.upper
    # Asked alone or together, a metric sees the same replicates: the same interval.
    assert paired_bootstrap_difference(y, a, b, "average_precision", clusters=card, resamples=300, seed=4) == ap
    assert paired_bootstrap_difference(y, a, b, "recall_at_rate", clusters=card, resamples=300, seed=4,
                                       rate=0.05) == recall
    with pytest.raises(ValueError, match="rate="):
        paired_bootstrap_difference(y, a, b, "recall_at_rate", resamples=100)


def test_one_models_recall_interval_covers_the_portfolios_recall_about_as_often_as_it_claims():
    """Holdouts drawn from one portfolio: the 95% interval of each holdout's recall at the budget holds
    the portfolio's own recall (a holdout 200 times larger) in about 95% of them, not in all or few."""
    rng = np.random.default_rng(21)

    def portfolio(n):
        y = (rng.random(n) < 0.03).astype(np.int64)
        return y, rng.normal(0.0, 1.0, n) + 2.0 * y

    truth = recall_at_rate(*portfolio(400_000), 0.02)
    covered, widths = 0, []
    for seed in range(60):
        y, s = portfolio(2000)
        (recall,) = bootstrap_intervals(y, s, ("recall_at_rate",), resamples=300, seed=seed, rate=0.02)
        assert recall.estimate == pytest.approx(recall_at_rate(y, s, 0.02), abs=1e-12)
        assert (recall.method, recall.units) == ("bootstrap", 2000)
        covered += recall.lower <= truth <= recall.upper
        widths.append(recall.upper - recall.lower)
    assert 50 <= covered <= 60 and 0.05 < np.mean(widths) < 0.5


def test_one_models_interval_by_card_undoes_duplicated_rows_and_matches_the_paired_draws():
    y, a, b = two_models(np.random.default_rng(22), n=1000)
    (original,) = bootstrap_intervals(y, a, ("recall_at_rate",), resamples=400, seed=5, rate=0.05)
    copies = [np.repeat(v, 5) for v in (y, a)]
    cards = np.repeat(np.arange(y.size), 5)
    (by_card,) = bootstrap_intervals(*copies, ("recall_at_rate",), clusters=cards, resamples=400, seed=5, rate=0.05)
    assert (by_card.estimate, by_card.lower, by_card.upper) == pytest.approx(
        (original.estimate, original.lower, original.upper), abs=1e-12)  # the same draws of the same evidence
    (by_row,) = bootstrap_intervals(*copies, ("recall_at_rate",), resamples=400, seed=5, rate=0.05)
    assert half_width(by_row) < 0.6 * half_width(original)
    # Any bootstrap metric, not only the budget ones.
    assert bootstrap_intervals(y, a, ("average_precision",), resamples=100)[0].estimate == pytest.approx(
        average_precision_score(y, a), abs=1e-12)


def test_intervals_are_nan_without_both_classes():
    y = np.zeros(50, dtype=np.int64)
    scores = np.linspace(0, 1, 50)
    assert math.isnan(delong_auc_difference(y, scores, scores).upper)
    assert math.isnan(paired_bootstrap_difference(y, scores, scores, resamples=100).upper)


def test_wilson_interval_matches_the_published_value_and_stays_in_the_unit_interval():
    assert wilson_interval(8, 10, 0.95) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # Newcombe (1998), table I
    assert wilson_interval(0, 20, 0.95)[0] == pytest.approx(0.0, abs=1e-12)
    assert wilson_interval(20, 20, 0.95)[1] == pytest.approx(1.0, abs=1e-12)
    assert wilson_interval(3, 20, 0.95)[1] < wilson_upper_bound(3, 20, 0.975) + 1e-12  # the same bound, two-sided
    assert wilson_interval(0, 0, 0.95) == (0.0, 1.0)


def test_report_carries_counts():
    report = classification_report([1, 0, 0, 1], [0.9, 0.2, 0.3, 0.6], ["a", "b", "c", "d"], [1, 1, 1, 1])
    assert report["n"] == 4 and report["n_fraud"] == 2 and report["auc_roc"] == 1.0
    assert report["card_precision_at_100"] == 2 / 100


def test_the_binomial_tail_is_the_sum_of_its_terms():
    assert binomial_at_most(3, 10, 0.5) == pytest.approx(176 / 1024)
    assert binomial_at_most(0, 697, 0.0147) == pytest.approx((1 - 0.0147) ** 697)
    assert binomial_at_most(10, 10, 0.3) == pytest.approx(1.0) and binomial_at_most(2, 5, 0.0) == 1.0
    assert binomial_at_most(4, 5, 1.0) == 0.0 and binomial_at_most(5, 5, 1.0) == 1.0


def test_the_exact_upper_bound_leaves_the_observed_count_or_fewer_a_tail_of_one_minus_the_confidence():
    assert binomial_upper_bound(0, 6, 0.95) == pytest.approx(1 - 0.05 ** (1 / 6))  # (1 - u)^6 = 0.05
    for k, n in ((7, 29), (65, 183), (1, 3)):
        upper = binomial_upper_bound(k, n, 0.95)
        assert k / n < upper < 1 and binomial_at_most(k, n, upper) == pytest.approx(0.05, abs=1e-9)
    assert binomial_upper_bound(0, 0, 0.95) == 1.0 and binomial_upper_bound(5, 5, 0.95) == 1.0


def test_the_auc_upper_bound_covers_the_portfolios_auc_about_as_often_as_it_claims():
    """Days drawn from one portfolio: the one-sided 95% bound of each day's AUC lies at or above the
    portfolio's own AUC in about 95% of them; by card, a day whose frauds come in pairs per card still does."""
    rng = np.random.default_rng(31)

    def day(n, cards_per_fraud=1):
        y = (rng.random(n) < 0.03).astype(np.int64)
        card_effect = rng.normal(0.0, 1.0, n)  # a card's frauds score alike
        s = np.repeat(rng.normal(0.0, 1.0, n) + 1.5 * y + card_effect, cards_per_fraud)[:n]
        return np.repeat(y, cards_per_fraud)[:n], s, np.repeat(np.arange(n), cards_per_fraud)[:n]

    truth = auc_roc(*day(400_000)[:2])
    covered = [auc_upper_bound(y, s, confidence=0.95)[1] >= truth for y, s, _ in (day(3000) for _ in range(80))]
    assert 70 <= sum(covered) <= 80
    paired = [day(3000, cards_per_fraud=2) for _ in range(80)]
    by_card = [auc_upper_bound(y, s, cards, 0.95)[1] >= truth for y, s, cards in paired]
    by_row = [auc_upper_bound(y, s, None, 0.95)[1] >= truth for y, s, _ in paired]
    assert 70 <= sum(by_card) <= 80 and sum(by_row) < sum(by_card)


def test_the_auc_upper_bound_is_the_auc_at_confidence_0_and_nan_without_both_classes():
    y, a, _ = two_models(np.random.default_rng(32))
    auc, upper = auc_upper_bound(y, a, confidence=0.0)
    assert auc == upper == pytest.approx(auc_roc(y, a), abs=1e-12)
    assert auc_upper_bound(y, a, confidence=0.95)[1] > auc
    assert all(math.isnan(v) for v in auc_upper_bound(np.zeros(10), np.arange(10.0)))


def test_between_day_auc_variance_is_the_spread_of_days_beyond_their_own_bounds():
    rng = np.random.default_rng(33)

    def days(separations):
        y, s, d = [], [], []
        for i, sep in enumerate(separations):
            yi = (rng.random(4000) < 0.03).astype(np.int64)
            y.append(yi)
            s.append(rng.normal(0.0, 1.0, yi.size) + sep * yi)
            d.append(np.full(yi.size, i))
        return np.concatenate(y), np.concatenate(s), np.concatenate(d)

    alike = between_day_auc_variance(*days([1.5] * 8))
    mixed_separations = [0.8, 2.4] * 4  # another fraud mix every other day
    y, s, d = days(mixed_separations)
    mixed = between_day_auc_variance(y, s, d)
    day_aucs = [auc_roc(y[d == i], s[d == i]) for i in range(8)]
    assert alike < 0.0005 and mixed == pytest.approx(np.var(day_aucs, ddof=1), rel=0.35) and mixed > 0.01
    # The bound widens by it; two days are too few to tell a spread.
    assert auc_upper_bound(y, s, None, 0.95, mixed)[1] > auc_upper_bound(y, s, None, 0.95)[1]
    assert between_day_auc_variance(y[d < 2], s[d < 2], d[d < 2]) == 0.0
