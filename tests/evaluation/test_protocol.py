"""The evaluation protocol against hand-computed days: layout planning, known-compromised removal,
daily card ranking, detected-card exclusion, per-pattern recall, plus properties on random days."""

from __future__ import annotations

import json
import math
from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest

from pipeline.datasets.manifest import DateWindow
from pipeline.evaluation.protocol import (
    BacktestDays,
    BacktestLayout,
    ProtocolError,
    evaluate_protocol,
    plan_backtest,
)

NO_DELAY = timedelta(0)


def scored(rows: list[tuple], *, reported: bool = False, patterns: bool = False) -> pd.DataFrame:
    """Rows ``(card, event_time, score, label[, reported_at][, pattern])`` -> a scored test frame.

    Times are UTC strings; event_time is stored as microseconds, the unit dataset shards carry.
    """
    names = ["card_id", "event_time", "score", "label"] + (["reported_at"] if reported else []) + \
        (["fraud_pattern"] if patterns else [])
    frame = pd.DataFrame(rows, columns=names)
    frame.insert(0, "transaction_id", [f"tx-{i}" for i in range(len(frame))])
    frame["event_time"] = pd.to_datetime(frame["event_time"], utc=True).astype("datetime64[us, UTC]")
    if reported:
        frame["reported_at"] = pd.to_datetime(frame["reported_at"], utc=True)
    return frame


# ---------------------------------------------------------------------------------------------- layout

DAYS = BacktestDays(train=14, validation=3, gap=7, test=3)


def test_plan_counts_back_from_the_last_test_day_with_a_gap_of_maturity_days():
    layout = plan_backtest(date(2026, 1, 31), DAYS)
    # test: 3 days ending 01-31 -> 01-29..01-31; gap: the 7 days before -> 01-22..01-28;
    # validation: 3 days before -> 01-19..01-21; train: 14 days before -> 01-05..01-18.
    assert layout.windows() == {"train": DateWindow("2026-01-05", "2026-01-18"),
                                "validation": DateWindow("2026-01-19", "2026-01-21"),
                                "gap": DateWindow("2026-01-22", "2026-01-28"),
                                "test": DateWindow("2026-01-29", "2026-01-31")}
    # Training rows end D = 01-21; their labels are as known at D + G = 01-28.
    assert layout.train_label_cutoff == date(2026, 1, 28)
    # The last test row (01-31) has its full 7 days on 02-07.
    assert layout.test_label_cutoff == date(2026, 2, 7)
    assert layout.gap_days == 7


def test_nightly_run_date_is_the_test_label_cutoff_and_splits_hold_no_gap():
    run_date = date(2026, 2, 7)
    layout = plan_backtest(run_date - timedelta(days=DAYS.gap), DAYS)
    assert layout.test_label_cutoff == run_date
    assert list(layout.splits()) == ["train", "validation", "test"]  # DatasetPlan.splits' keys
    assert layout.splits()["test"] == DateWindow("2026-01-29", "2026-01-31")


def test_one_day_windows_are_the_smallest_layout():
    layout = plan_backtest(date(2026, 3, 4), BacktestDays(train=1, validation=1, gap=1, test=1))
    # 03-01 train, 03-02 validation, 03-03 gap, 03-04 test.
    assert [w.start for w in layout.windows().values()] == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]
    assert layout.train_label_cutoff == date(2026, 3, 3)
    assert layout.test_label_cutoff == date(2026, 3, 5)


@pytest.mark.parametrize("field", ["train", "validation", "gap", "test"])
@pytest.mark.parametrize("value", [0, -2])
def test_non_positive_day_counts_are_refused_by_name(field, value):
    counts = {"train": 14, "validation": 3, "gap": 7, "test": 3, field: value}
    with pytest.raises(ProtocolError, match=f"{field} days must be a whole number >= 1"):
        BacktestDays(**counts)


def test_explicit_windows_must_not_overlap_nor_leave_holes():
    train, validation = DateWindow("2026-01-01", "2026-01-10"), DateWindow("2026-01-11", "2026-01-12")
    gap, test = DateWindow("2026-01-13", "2026-01-19"), DateWindow("2026-01-20", "2026-01-22")
    assert BacktestLayout(train, validation, gap, test).gap_days == 7
    with pytest.raises(ProtocolError, match="test window starts 2026-01-19, inside the gap window"):
        BacktestLayout(train, validation, gap, DateWindow("2026-01-19", "2026-01-22"))
    with pytest.raises(ProtocolError, match="not the day after the validation window ends"):
        BacktestLayout(train, validation, DateWindow("2026-01-14", "2026-01-19"), test)
    with pytest.raises(ProtocolError, match="ends before it starts"):
        BacktestLayout(DateWindow("2026-01-10", "2026-01-01"), validation, gap, test)
    with pytest.raises(ProtocolError, match="not a YYYY-MM-DD date"):
        BacktestLayout(train, DateWindow("2026-1-11", "2026-01-12"), gap, test)


# ---------------------------------------------------------------------- known-compromised removal


def test_cards_known_before_a_day_starts_are_removed_from_that_day():
    frame = scored([
        # A: fraud reported 03-01 17:00, + 6 h = 03-01 23:00 < 03-02 00:00 -> removed on days 2 and 3.
        ("A", "2026-03-01T10:00Z", 0.9, 1, "2026-03-01T17:00Z"),
        ("A", "2026-03-02T10:00Z", 0.9, 0, None),
        ("A", "2026-03-03T10:00Z", 0.9, 0, None),
        # B: reported 03-01 18:00, + 6 h = exactly 03-02 00:00, not before it -> kept on day 2, removed day 3.
        ("B", "2026-03-01T11:00Z", 0.8, 1, "2026-03-01T18:00Z"),
        ("B", "2026-03-02T11:00Z", 0.8, 0, None),
        ("B", "2026-03-03T11:00Z", 0.8, 0, None),
        # T: fraud in the training period -> removed every day.
        ("T", "2026-03-01T12:00Z", 0.7, 0, None),
        ("T", "2026-03-02T12:00Z", 0.7, 0, None),
        # P: fraud in the gap reported 03-01 05:00 (+ 6 h = 11:00) -> kept day 1, removed day 2.
        ("P", "2026-03-01T12:00Z", 0.6, 0, None),
        ("P", "2026-03-02T12:00Z", 0.6, 0, None),
        # Q: a fraud on day 1 nobody reported -> never known.
        ("Q", "2026-03-01T12:00Z", 0.5, 1, None),
        ("Q", "2026-03-03T12:00Z", 0.5, 0, None),
    ], reported=True)
    prior = pd.DataFrame({"card_id": ["P", "not-in-window"],
                          "reported_at": pd.to_datetime(["2026-03-01T05:00Z", "2026-02-20T00:00Z"], utc=True)})
    report = evaluate_protocol(frame, label_delay=timedelta(hours=6), known_compromised={"T", "unseen"},
                               prior_reports=prior, k=1)
    # Day 1: T removed; day 2: A, T, P removed; day 3: A, B removed. (k = 1: day 1's top card is A, so
    # B and Q, not detected, still rank on days 2 and 3.)
    assert [(d.day, d.known_removed, d.cards) for d in report.days] == [
        ("2026-03-01", 1, 4), ("2026-03-02", 3, 1), ("2026-03-03", 2, 1)]
    assert report.n_known_removed == 6  # one row per removed (card, day)
    assert (report.n, report.n_fraud) == (6, 3)  # A, B and Q's day-1 frauds stay: unknown on their own day


def test_transaction_metrics_are_computed_without_known_compromised_rows():
    frame = scored([
        ("T", "2026-03-01T09:00Z", 0.1, 1),  # the training-period card: a low-scored fraud
        ("F", "2026-03-01T10:00Z", 0.9, 1),
        ("G", "2026-03-01T11:00Z", 0.5, 0),
        ("H", "2026-03-01T12:00Z", 0.2, 0),
    ])
    report = evaluate_protocol(frame, label_delay=NO_DELAY, known_compromised=["T"])
    # Without T: the only fraud (0.9) outranks both genuine payments -> AUC 1 (with T it would be 2/4 = 0.5).
    assert report.auc_roc == 1.0
    assert report.average_precision == 1.0
    assert report.recall_at_1pct_fpr == 1.0
    assert (report.n, report.n_fraud, report.n_known_removed) == (3, 1, 1)
    # ECE, one bin per row here: (|1 - 0.9| + |0 - 0.5| + |0 - 0.2|) / 3 = 0.8 / 3.
    assert report.ece == pytest.approx(0.8 / 3)


# ---------------------------------------------------------------------------- card precision@k


def test_cards_rank_by_their_highest_score_and_are_fraudulent_if_any_payment_is():
    frame = scored([
        ("a", "2026-03-01T01:00Z", 0.70, 0), ("a", "2026-03-01T02:00Z", 0.05, 0),
        ("b", "2026-03-01T03:00Z", 0.60, 1),
        ("d", "2026-03-01T04:00Z", 0.95, 0), ("d", "2026-03-01T05:00Z", 0.01, 1),
    ])
    report = evaluate_protocol(frame, label_delay=NO_DELAY, k=2)
    # Card scores by max: d 0.95, a 0.70, b 0.60 -> top 2 = d, a. d is fraudulent (its second
    # payment), a is not -> 1 hit / 2 = 0.5. (By mean score the top 2 would be b, d -> 1.0.)
    assert report.card_precision_at_k == 0.5
    assert report.days[0].hits == 1 and report.days[0].fraud_cards == 2 and report.days[0].cards == 3


def test_cards_detected_on_an_earlier_day_leave_later_days():
    frame = scored([
        # Day 1: x 0.9 fraud, y 0.8 genuine, z 0.3 fraud -> top 1 = x, a hit: 1/1; x is detected.
        ("x", "2026-03-01T01:00Z", 0.90, 1), ("y", "2026-03-01T02:00Z", 0.80, 0), ("z", "2026-03-01T03:00Z", 0.30, 1),
        # Day 2: x is blocked; of y 0.8 genuine, z 0.7 fraud the top 1 is y -> 0/1 (x would have been 1/1).
        ("x", "2026-03-02T01:00Z", 0.99, 1), ("y", "2026-03-02T02:00Z", 0.80, 0), ("z", "2026-03-02T03:00Z", 0.70, 1),
        # Day 3: y (in day 2's top 1 but genuine) still ranks; z 0.5 fraud over y 0.4 -> 1/1.
        ("y", "2026-03-03T02:00Z", 0.40, 0), ("z", "2026-03-03T03:00Z", 0.50, 1),
    ])
    report = evaluate_protocol(frame, label_delay=NO_DELAY, k=1)
    assert [d.precision for d in report.days] == [1.0, 0.0, 1.0]
    assert [d.detected_removed for d in report.days] == [0, 1, 0]
    assert report.card_precision_at_k == pytest.approx(2 / 3)


def test_a_day_with_fewer_cards_than_k_still_divides_by_k():
    frame = scored([("a", "2026-03-01T01:00Z", 0.9, 1), ("b", "2026-03-01T02:00Z", 0.8, 1),
                    ("c", "2026-03-01T03:00Z", 0.7, 0)])
    # 3 cards, both frauds found, but 100 slots: 2 / 100.
    assert evaluate_protocol(frame, label_delay=NO_DELAY).card_precision_at_k == 0.02
    assert evaluate_protocol(frame, label_delay=NO_DELAY, k=2).card_precision_at_k == 1.0


def test_equal_card_scores_rank_by_card_id():
    frame = scored([("c2", "2026-03-01T01:00Z", 0.5, 0), ("c1", "2026-03-01T02:00Z", 0.5, 1)])
    # Tie at 0.5: c1 sorts first, and it is the fraud -> 1/1, whatever the row order.
    assert evaluate_protocol(frame, label_delay=NO_DELAY, k=1).card_precision_at_k == 1.0
    assert evaluate_protocol(frame.iloc[::-1], label_delay=NO_DELAY, k=1).card_precision_at_k == 1.0


# ------------------------------------------------------------------------------ per-pattern recall


def test_pattern_recall_counts_truth_tagged_frauds_in_the_top_percent():
    rows = [(f"g{i}", "2026-03-01T12:00Z", 0.5 - i / 1000, 0, "genuine") for i in range(195)]
    rows += [
        ("ct1", "2026-03-01T01:00Z", 0.99, 1, "card_testing"),
        ("ct2", "2026-03-01T02:00Z", 0.10, 0, "card_testing"),  # never reported: label 0, still its pattern's fraud
        ("ato", "2026-03-01T03:00Z", 0.98, 1, "account_takeover"),
        ("u1", "2026-03-01T04:00Z", 0.97, 0, None),  # no tag: in the top but belongs to no pattern
        ("u2", "2026-03-01T05:00Z", 0.01, 0, None),
    ]
    report = evaluate_protocol(scored(rows, patterns=True), label_delay=NO_DELAY)
    # 200 rows -> the top 1% is 2 rows: 0.99 (ct1) and 0.98 (ato). card_testing: 1 of 2; account_takeover: 1 of 1.
    assert report.pattern_recall == {"account_takeover": 1.0, "card_testing": 0.5}
    assert report.pattern_frauds == {"account_takeover": 1, "card_testing": 2}


def test_a_constant_scorer_catches_each_pattern_at_the_top_share():
    rows = [(f"c{i}", "2026-03-01T12:00Z", 0.3, int(i < 20), "geo_impossible" if i < 20 else "genuine")
            for i in range(300)]
    # 300 rows tied -> 3 places shared by all 300: each fraud counts 3/300 = 0.01.
    report = evaluate_protocol(scored(rows, patterns=True), label_delay=NO_DELAY)
    assert report.pattern_recall == {"geo_impossible": pytest.approx(0.01)}


def test_no_pattern_column_gives_no_pattern_recall():
    report = evaluate_protocol(scored([("a", "2026-03-01T01:00Z", 0.9, 1)]), label_delay=NO_DELAY)
    assert report.pattern_recall == {} and report.pattern_frauds == {}


# ---------------------------------------------------------------------------------- properties


def random_days(seed: int, n_cards: int = 60, n_days: int = 4) -> pd.DataFrame:
    """Random payments; each fraudulent card is fraudulent on exactly one day (all its payments that day)."""
    rng = np.random.default_rng(seed)
    start = pd.Timestamp("2026-03-01", tz="UTC")
    fraud_day = np.where(rng.random(n_cards) < 0.3, rng.integers(0, n_days, n_cards), -1)
    card = rng.integers(0, n_cards, 2_000)
    offset = rng.integers(0, n_days * 86_400, card.size)
    label = (fraud_day[card] == offset // 86_400).astype(int)
    return pd.DataFrame({"transaction_id": [f"t{i}" for i in range(card.size)], "card_id": [f"c{c:03d}" for c in card],
                         "event_time": start + pd.to_timedelta(offset, unit="s"), "score": rng.random(card.size),
                         "label": label})


@pytest.mark.parametrize("seed", range(5))
def test_a_perfect_scorer_finds_min_of_fraud_cards_and_k_each_day(seed):
    frame = random_days(seed)
    frame["score"] = frame["label"] * 0.5 + frame["score"] * 0.4  # every fraud above every genuine payment
    frame_days = frame["event_time"].dt.strftime("%Y-%m-%d")
    fraud_cards = frame[frame["label"] == 1].groupby(frame_days)["card_id"].nunique()
    for k in (1, 3, 8, 100):
        report = evaluate_protocol(frame, label_delay=NO_DELAY, k=k)
        expected = [min(int(fraud_cards.get(d.day, 0)), k) / k for d in report.days]
        assert [d.precision for d in report.days] == expected
        assert len(report.days) == frame_days.nunique()


@pytest.mark.parametrize("seed", range(3))
def test_an_inverted_scorer_finds_nothing_while_genuine_cards_fill_k(seed):
    frame = random_days(seed)
    frame["score"] = 1.0 - frame["label"]
    report = evaluate_protocol(frame, label_delay=NO_DELAY, k=5)
    assert report.card_precision_at_k == 0.0
    assert report.auc_roc == 0.0


@pytest.mark.parametrize("seed", range(3))
def test_row_order_does_not_change_the_report(seed):
    frame = random_days(seed)
    frame["reported_at"] = frame["event_time"].where(frame["label"] == 1) + pd.Timedelta(hours=5)
    first = evaluate_protocol(frame, label_delay=timedelta(hours=2), known_compromised={"c001"}, k=4).to_dict()
    shuffled = frame.sample(frac=1.0, random_state=seed)
    second = evaluate_protocol(shuffled, label_delay=timedelta(hours=2), known_compromised={"c001"}, k=4).to_dict()
    # ECE sums bins in row order: equal up to the last bit; everything else exactly equal.
    assert first.pop("ece") == pytest.approx(second.pop("ece"), rel=1e-12)
    assert first == second
    assert first["n_known_removed"] > 0  # the property covers removal, not only ranking


# --------------------------------------------------------------------------------- report and errors


def test_report_serialises_with_card_precision_named_by_k():
    report = evaluate_protocol(random_days(0), label_delay=NO_DELAY, k=5)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["card_precision_at_5"] == report.card_precision_at_k and d["k"] == 5
    assert [day["day"] for day in d["days"]] == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"]


def test_empty_frame_gives_nan_not_errors():
    report = evaluate_protocol(scored([]), label_delay=NO_DELAY)
    assert math.isnan(report.card_precision_at_k) and math.isnan(report.auc_roc) and report.days == ()


@pytest.mark.parametrize(("change", "message"), [
    (lambda f: f.drop(columns="card_id"), r"lacks column\(s\) \['card_id'\]"),
    (lambda f: f.assign(score=[np.nan, 0.1]), "1 scores are NaN or infinite"),
    (lambda f: f.assign(label=[2, 0]), "label must be 0 or 1"),
    (lambda f: f.assign(event_time=pd.NaT), "event_time is missing"),
])
def test_unusable_frames_are_refused_with_what_to_fix(change, message):
    frame = scored([("a", "2026-03-01T01:00Z", 0.9, 1), ("b", "2026-03-01T02:00Z", 0.1, 0)])
    with pytest.raises(ProtocolError, match=message):
        evaluate_protocol(change(frame), label_delay=NO_DELAY)


def test_bad_parameters_are_refused():
    frame = scored([("a", "2026-03-01T01:00Z", 0.9, 1)])
    with pytest.raises(ProtocolError, match="k must be"):
        evaluate_protocol(frame, label_delay=NO_DELAY, k=0)
    with pytest.raises(ProtocolError, match="label_delay must not be negative"):
        evaluate_protocol(frame, label_delay=timedelta(hours=-1))
