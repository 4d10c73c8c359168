"""live_days.jsonl: one line per night (a night played again replaces its own), pooled against the promise."""

from __future__ import annotations

import dataclasses
import json
from datetime import date

import pandas as pd
import pytest

from pipeline.demo.live_days import (
    LIVE_DAYS_FILE,
    LiveDay,
    holdout_promise,
    load_live_days,
    pooled,
    pooled_lines,
    record_live_day,
    reported_frauds,
)
from pipeline.nightly.records import GateOutcome

FIELDS = {"night", "live_day", "version", "payments", "flagged", "realised_review_rate", "frauds", "frauds_stopped",
          "review_budget", "holdout_recall_at_budget", "holdout_recall_ci",
          "label_maturity_days", "frauds_reported", "frauds_reported_stopped"}


def _day(night: int, **changes) -> LiveDay:
    base = LiveDay(night=night, live_day=f"2026-02-0{4 + night}", version=1, payments=6000, flagged=30,
                   realised_review_rate=0.005, frauds=20, frauds_stopped=12, review_budget=0.005,
                   holdout_recall_at_budget=0.6, holdout_recall_ci=[0.5, 0.7], label_maturity_days=7,
                   frauds_reported=10, frauds_reported_stopped=6)
    return dataclasses.replace(base, **changes)


def test_each_night_is_one_line_with_the_issues_fields_and_a_replayed_night_replaces_its_own(tmp_path):
    record_live_day(tmp_path, _day(1))
    record_live_day(tmp_path, _day(2, frauds_stopped=5))
    days = record_live_day(tmp_path, _day(2, frauds_stopped=7))  # night 2 played again after a failure
    lines = (tmp_path / LIVE_DAYS_FILE).read_text().splitlines()
    assert len(lines) == 2 and all(set(json.loads(line)) == FIELDS for line in lines)
    assert [d.frauds_stopped for d in load_live_days(tmp_path)] == [d.frauds_stopped for d in days] == [12, 7]


def test_pooled_adds_the_nights_and_weights_each_promise_by_its_reported_frauds():
    days = [_day(1, frauds=10, frauds_stopped=3, frauds_reported=5, frauds_reported_stopped=2,
                 holdout_recall_at_budget=0.5, holdout_recall_ci=[0.4, 0.6]),
            _day(2, frauds=30, frauds_stopped=21, frauds_reported=15, frauds_reported_stopped=12,
                 holdout_recall_at_budget=0.9, holdout_recall_ci=[0.8, 1.0], flagged=40)]
    p = pooled(days)
    assert (p.nights, p.payments, p.flagged, p.frauds, p.frauds_stopped) == (2, 12000, 70, 40, 24)
    assert (p.frauds_reported, p.frauds_reported_stopped, p.label_maturity_days) == (20, 14, 7)
    assert p.live_recall == pytest.approx(0.6) and p.reported_recall == pytest.approx(0.7)
    assert p.realised_review_rate == pytest.approx(70 / 12000)
    assert p.promised_recall == pytest.approx((0.5 * 5 + 0.9 * 15) / 20)
    assert p.promised_ci == pytest.approx(((0.4 * 5 + 0.8 * 15) / 20, (0.6 * 5 + 1.0 * 15) / 20))


def test_the_summary_compares_the_promise_with_the_recall_of_the_frauds_it_counts():
    lines = pooled_lines([_day(1, frauds=20, frauds_stopped=8, frauds_reported=10, frauds_reported_stopped=6)])
    assert lines == [
        "   live days so far (1 night(s), 6000 payments): 30 sent to review or blocked (0.50% against a budget of 0.50%)",
        "   frauds reported within 7 days (what the gate's holdout counts): 6 of 10 stopped, recall 0.600 "
        "(95% 0.313-0.832)",
        "   every fraud (the simulator's truth, 10 of them reported later or never): 8 of 20 stopped, recall 0.400 "
        "(95% 0.219-0.613)",
        "   the gate's holdout promised recall 0.600 (95% interval 0.500-0.700) at the budget: live recall of "
        "reported frauds is inside it"]
    assert pooled_lines([_day(1, frauds_reported_stopped=3)])[-1].endswith("reported frauds is OUTSIDE it")
    assert pooled_lines([]) == ["   live days so far: none scored yet (no champion)"]


def test_reported_frauds_are_those_labelled_fraud_by_the_days_label_cutoff():
    day = date(2026, 2, 5)  # cutoff with 7 days' maturity: before 2026-02-13T00:00Z
    labels = pd.DataFrame([("tx-on-time", True, "2026-02-12T23:59:59Z"), ("tx-late", True, "2026-02-13T00:00:00Z"),
                           ("tx-cleared", True, "2026-02-07T10:00:00Z"), ("tx-cleared", False, "2026-02-09T10:00:00Z"),
                           ("tx-cleared-late", True, "2026-02-07T10:00:00Z"),
                           ("tx-cleared-late", False, "2026-02-20T10:00:00Z"), ("tx-genuine", False, "2026-02-06T00:00:00Z")],
                          columns=["transaction_id", "is_fraud", "reported_at"])
    assert reported_frauds(labels, day, 7) == {"tx-on-time", "tx-cleared-late"}


def _gate(**changes) -> GateOutcome:
    base = dict(outcome="rejected", promoted=False, challenger_version=2, compared_with=1, champion_version=1,
                reasons=(), warnings=(), replayed=False, text="",
                challenger_metrics={"recall_at_budget": 0.7, "recall_at_budget_lower": 0.6,
                                    "recall_at_budget_upper": 0.8},
                champion_metrics={"recall_at_budget": 0.65, "recall_at_budget_lower": 0.55,
                                  "recall_at_budget_upper": 0.75})
    return GateOutcome(**(base | changes))


def test_the_promise_is_the_served_versions_figure_on_the_nights_holdout():
    assert holdout_promise(_gate(), 1) == (0.65, [0.55, 0.75])  # rejected: the champion still serves
    assert holdout_promise(_gate(promoted=True, champion_version=2), 2) == (0.7, [0.6, 0.8])
    assert holdout_promise(_gate(), 5) == (None, None)  # a version tonight's gate did not score
    old = _gate(challenger_metrics={"recall_at_budget": 0.7})  # a decision recorded before intervals existed
    assert holdout_promise(old, 2) == (0.7, None)
