"""The degraded rule over a version's monitored days, and the history file it is kept in."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from pipeline.config import ConfigError
from pipeline.monitoring.config import MonitoringConfig
from pipeline.monitoring.history import (
    HistoryStore,
    MonitoringStateError,
    MonitorLocked,
    days_below_in_a_row,
    degraded_by,
    judge_day,
    monitor_lock,
    version_state,
)

CONFIG = MonitoringConfig(recall_margin=0.1, degraded_after_days=3, min_frauds=10)
EXPECTED = 0.6  # floor 0.5
DAY = date(2026, 3, 1)


def play(store: HistoryStore, days: list[tuple[int, float]], config: MonitoringConfig = CONFIG) -> list[str]:
    """Monitor consecutive days of (frauds, realised recall); the state of each day."""
    states = []
    for i, (frauds, recall) in enumerate(days):
        day = DAY + timedelta(days=i)
        entry = judge_day(day, frauds, recall, EXPECTED, config)
        streak = days_below_in_a_row(store.record("fd", 7, entry), day)
        states.append(version_state(entry, streak, config))
    return states


def test_degraded_only_after_n_judged_days_in_a_row_below_the_floor(tmp_path):
    store = HistoryStore(tmp_path)
    assert play(store, [(20, 0.45), (20, 0.40), (20, 0.45), (20, 0.48)]) == ["ok", "ok", "degraded", "degraded"]


def test_a_day_at_or_above_the_floor_breaks_the_run(tmp_path):
    store = HistoryStore(tmp_path)
    assert play(store, [(20, 0.4), (20, 0.4), (20, 0.5), (20, 0.4), (20, 0.4)]) == ["ok"] * 5


def test_days_with_too_few_frauds_are_insufficient_evidence_and_neither_extend_nor_break_the_run(tmp_path):
    store = HistoryStore(tmp_path)
    states = play(store, [(20, 0.4), (3, 0.0), (20, 0.4), (5, 1.0), (20, 0.4)])
    assert states == ["ok", "insufficient_evidence", "ok", "insufficient_evidence", "degraded"]


def test_with_a_confidence_a_day_is_below_only_when_its_upper_bound_is():
    """The exact (Clopper-Pearson) one-sided 95% upper bound for 7 of 29 frauds caught is the 95%
    quantile of Beta(8, 22): 0.40597 (scipy.stats.beta.ppf(0.95, 8, 22)); for 11 of 29, Beta(12, 18): 0.54877."""
    sure = MonitoringConfig(recall_margin=0.1, degraded_after_days=1, min_frauds=10, confidence=0.95)
    clear = judge_day(DAY, 29, 7 / 29, 0.53, sure)  # floor 0.43
    assert clear.recall_upper == pytest.approx(0.40597, abs=5e-5) and clear.below
    # 11 of 29 (0.379) is below the floor as a point, but not beyond chance.
    noisy = judge_day(DAY, 29, 11 / 29, 0.53, sure)
    assert noisy.recall_upper == pytest.approx(0.54877, abs=5e-5) and not noisy.below
    assert judge_day(DAY, 29, 11 / 29, 0.53, CONFIG).below  # confidence 0: the point estimate decides
    assert version_state(clear, 1, sure) == "degraded" and version_state(noisy, 0, sure) == "ok"


def test_a_day_of_few_frauds_none_caught_is_below_only_when_chance_rarely_does_that():
    """0 of n caught at a true recall p happens with probability (1 - p)^n. At the floor 0.358 (the quick
    bench's default model: expected 0.458), 0 of 6 happens 7% of the time: not below at 95%, though
    Wilson's bound (0.311) called it below; 0 of 10 happens 1.2% of the time: below."""
    sure = MonitoringConfig(recall_margin=0.1, degraded_after_days=1, min_frauds=5, confidence=0.95)
    six = judge_day(DAY, 6, 0.0, 0.458, sure)
    assert (1 - 0.358) ** 6 > 0.05 and not six.below
    assert six.recall_upper == pytest.approx(1 - 0.05 ** (1 / 6), abs=1e-9)  # (1 - u)^6 = 0.05
    ten = judge_day(DAY, 10, 0.0, 0.458, sure)
    assert (1 - 0.358) ** 10 < 0.05 and ten.below
    assert ten.recall_upper == pytest.approx(1 - 0.05 ** (1 / 10), abs=1e-9)


def test_confidence_outside_0_1_is_refused():
    with pytest.raises(ConfigError, match=r"confidence must be in \[0, 1\)"):
        MonitoringConfig(confidence=1.0)


def test_without_an_expectation_a_day_is_unjudged(tmp_path):
    entry = judge_day(DAY, 50, 0.1, None, CONFIG)
    assert (entry.judged, entry.below, entry.recall_floor) == (False, False, None)
    assert version_state(entry, 0, CONFIG) == "unjudged"


def test_rerunning_a_day_replaces_its_entry_and_an_earlier_day_sees_only_its_past(tmp_path):
    store = HistoryStore(tmp_path)
    play(store, [(20, 0.4), (20, 0.4), (20, 0.4)])
    assert days_below_in_a_row(store.read("fd", 7), DAY + timedelta(days=2)) == 3
    assert days_below_in_a_row(store.read("fd", 7), DAY + timedelta(days=1)) == 2  # a re-run of day 2
    fixed = store.record("fd", 7, judge_day(DAY + timedelta(days=1), 20, 0.9, EXPECTED, CONFIG))
    assert [d.date for d in fixed] == ["2026-03-01", "2026-03-02", "2026-03-03"]
    assert days_below_in_a_row(fixed, DAY + timedelta(days=2)) == 1
    assert store.read("fd", 8) == []  # versions keep separate histories


def test_a_corrupt_history_names_the_file_to_move(tmp_path):
    store = HistoryStore(tmp_path)
    store.path("fd", 7).parent.mkdir(parents=True)
    store.path("fd", 7).write_text("{")
    with pytest.raises(MonitoringStateError, match="v7.json is not a monitoring history"):
        store.read("fd", 7)


def test_one_monitor_at_a_time(tmp_path):
    with monitor_lock(tmp_path):
        with pytest.raises(MonitorLocked, match="another monitor run"):
            with monitor_lock(tmp_path):
                pass
    with monitor_lock(tmp_path):  # released
        pass



def test_a_day_with_a_stuck_feature_is_degraded_whatever_its_recall_or_evidence(tmp_path):
    few_frauds = judge_day(DAY, 3, 0.9, EXPECTED, CONFIG, ("amount",))
    assert version_state(few_frauds, 0, CONFIG) == "degraded"
    assert version_state(judge_day(DAY, 3, 0.9, EXPECTED, CONFIG), 0, CONFIG) == "insufficient_evidence"
    store = HistoryStore(tmp_path)
    store.record("m", 1, few_frauds)
    assert store.read("m", 1)[0].broken_features == ("amount",)  # kept in the history as written


def test_stuck_feature_share_is_off_or_a_majority():
    with pytest.raises(ConfigError, match="stuck_feature_share"):
        MonitoringConfig(stuck_feature_share=0.4)


def test_degraded_by_names_every_rule_that_fired_and_none_on_a_healthy_day():
    config = MonitoringConfig(recall_margin=0.1, degraded_after_days=2, min_frauds=10)
    below = judge_day(DAY, 20, 0.3, EXPECTED, config)
    assert degraded_by(below, 1, config) == ()  # one day below, two asked
    assert degraded_by(below, 2, config) == ("recall_below_floor",)
    assert version_state(below, 2, config) == "degraded"
    healthy = judge_day(DAY, 20, 0.6, EXPECTED, config)
    assert degraded_by(healthy, 0, config) == () and version_state(healthy, 0, config) == "ok"
    both = judge_day(DAY, 20, 0.3, EXPECTED, config, ("amount", "hour@channel_code=11"))
    assert degraded_by(both, 2, config) == ("stuck_feature", "stuck_feature_in_segment", "recall_below_floor")
    in_segment = judge_day(DAY, 3, None, EXPECTED, config, ("hour@channel_code=11",))  # few frauds: no recall rule
    assert degraded_by(in_segment, 5, config) == ("stuck_feature_in_segment",)
    assert version_state(in_segment, 5, config) == "degraded"
    out_of_range = judge_day(DAY, 3, None, EXPECTED, config, (), ("amount",))
    assert degraded_by(out_of_range, 0, config) == ("out_of_range",)
    assert version_state(out_of_range, 0, config) == "degraded"


def test_out_of_range_features_are_kept_in_the_history(tmp_path):
    store = HistoryStore(tmp_path)
    store.record("m", 1, judge_day(DAY, 3, None, EXPECTED, CONFIG, ("hour@channel_code=11",), ("amount",)))
    kept = store.read("m", 1)[0]
    assert kept.out_of_range_features == ("amount",) and kept.broken_features == ("hour@channel_code=11",)


def test_a_day_whose_frauds_rank_below_the_auc_floor_is_short_even_with_recall_at_its_floor(tmp_path):
    config = MonitoringConfig(recall_margin=0.1, degraded_after_days=2, min_frauds=10, auc_margin=0.05)
    # Recall 0.55 is above the floor 0.5; the day's AUC bound 0.83 is below 0.92 - 0.05.
    ranked_low = judge_day(DAY, 20, 0.55, EXPECTED, config, ranking=(0.80, 0.83), expected_auc=0.92)
    assert ranked_low.auc_floor == pytest.approx(0.87)
    assert (ranked_low.below, ranked_low.ranking_below, ranked_low.recall_below) == (True, True, False)
    assert degraded_by(ranked_low, 1, config) == () and degraded_by(ranked_low, 2, config) == ("ranking_below_floor",)
    # Within chance (the bound reaches the floor), off (margin 0), or too few frauds: not short.
    assert not judge_day(DAY, 20, 0.55, EXPECTED, config, ranking=(0.80, 0.90), expected_auc=0.92).below
    off = MonitoringConfig(recall_margin=0.1, degraded_after_days=2, min_frauds=10)
    assert not judge_day(DAY, 20, 0.55, EXPECTED, off, ranking=(0.80, 0.83), expected_auc=0.92).below
    assert not judge_day(DAY, 5, 0.55, EXPECTED, config, ranking=(0.80, 0.83), expected_auc=0.92).below
    few = judge_day(DAY, 12, 0.55, EXPECTED, config, ranking=(0.80, 0.83), expected_auc=0.92)  # judged on recall only
    assert few.judged and not few.below and config.auc_min_frauds == 20
    # Both rules short on one day: both named; the history keeps the ranking.
    both = judge_day(DAY, 20, 0.2, EXPECTED, config, ranking=(0.80, 0.83), expected_auc=0.92)
    assert degraded_by(both, 2, config) == ("recall_below_floor", "ranking_below_floor")
    store = HistoryStore(tmp_path)
    store.record("m", 1, both)
    assert store.read("m", 1)[0] == both


def test_a_history_written_before_the_ranking_rule_still_reads(tmp_path):
    store = HistoryStore(tmp_path)
    path = store.path("m", 1)
    path.parent.mkdir(parents=True)
    path.write_text('{"days": [{"date": "2026-03-01", "frauds": 20, "recall": 0.3, "expected_recall": 0.6, '
                    '"recall_floor": 0.5, "judged": true, "below": true, "recall_upper": 0.3}]}')
    [day] = store.read("m", 1)
    assert (day.recall_below, day.ranking_below, day.auc) == (True, False, None)



def test_more_fraud_cards_getting_past_the_model_than_factor_x_validation_is_a_short_day():
    from pipeline.monitoring.missed_frauds import MissedFrauds

    config = MonitoringConfig(recall_margin=0.1, degraded_after_days=1, min_frauds=10, missed_fraud_factor=2.0)
    # recall 0.55 is above its floor (0.5): only the missed fraud cards can make the day short
    above = judge_day(DAY, 20, 0.55, EXPECTED, config, missed=MissedFrauds(80, 28_000, 2.6, 2.07))
    assert above.missed_above and above.below and not above.recall_below
    assert version_state(above, 1, config) == "degraded"
    assert degraded_by(above, 1, config) == ("missed_frauds_above_factor",)
    # a ratio above the factor whose lower bound is not: chance, not evidence
    assert not judge_day(DAY, 20, 0.55, EXPECTED, config, missed=MissedFrauds(56, 28_000, 2.2, 1.39)).below
    # too few frauds to judge the day, or the rule off: never short
    assert not judge_day(DAY, 5, 0.55, EXPECTED, config, missed=MissedFrauds(80, 28_000, 9.0, 8.0)).below
    off = MonitoringConfig(recall_margin=0.1, degraded_after_days=1, min_frauds=10)
    assert not judge_day(DAY, 20, 0.55, EXPECTED, off, missed=MissedFrauds(80, 28_000, 9.0, 8.0)).below


def test_the_missed_fraud_evidence_survives_the_history_file(tmp_path):
    from pipeline.monitoring.missed_frauds import MissedFrauds

    store = HistoryStore(tmp_path)
    store.record("fd", 7, judge_day(DAY, 20, 0.55, EXPECTED, CONFIG, missed=MissedFrauds(12, 5_000, 1.5, 0.9)))
    (entry,) = store.read("fd", 7)
    assert (entry.missed_fraud_cards, entry.missed_fraud_ratio, entry.missed_fraud_ratio_lower) == (12, 1.5, 0.9)
