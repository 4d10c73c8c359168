"""The review-rate check: judged only with a budget and enough payments; degraded after the band is left for
the configured time, back to in band when the rate returns."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.decisions.operating_points import DecisionBudget, OperatingPoints
from pipeline.serving.config import AlertsConfig
from pipeline.serving.rate_check import ReviewRateCheck, judge_review_rate, rate_band
from pipeline.serving.rates import DecisionRates, WindowCounts
from pipeline.serving.reloader import LiveVersion
from pipeline.serving.thresholds import Thresholds
from tests.serving.conftest import FakeClock

ALERTS = AlertsConfig(rate_windows_s=(60,), review_rate_window_s=60, rate_band=0.5, degraded_after_s=120.0,
                      min_payments=1000)
BUDGET = DecisionBudget(review_rate=0.01, block_precision=0.0, block_rate=0.001)
POINTS = OperatingPoints(0.2, 0.6, "rate", BUDGET)


def live(source: str = "version", points: OperatingPoints | None = POINTS) -> LiveVersion:
    return LiveVersion(SimpleNamespace(version=4), Thresholds(0.2, 0.6, source, points))


def test_the_band_is_around_the_budget():
    assert rate_band(0.01, 0.5) == pytest.approx((0.005, 0.015))
    assert rate_band(0.01, 1.5)[0] == 0.0


@pytest.mark.parametrize(("flagged", "state"), [(4, "outside_band"), (5, "in_band"), (15, "in_band"),
                                                 (16, "outside_band")])
def test_judged_inside_or_outside_the_band(flagged, state):
    judged = judge_review_rate(WindowCounts(60, 1000, flagged, 0), live(), ALERTS)
    assert judged.state == state and judged.budget == 0.01
    assert f"{flagged} of 1000 payments" in judged.reason and "version 4's budget of 1.000%" in judged.reason


@pytest.mark.parametrize(("version", "reason"), [
    (None, "no model is live"),
    (live("config"), 'decision.thresholds = "config"'),
    (live("config_fallback", None), "version 4 ships no operating points"),
    (live("version", OperatingPoints(0.2, 0.6, "explicit", None)), "operating points are explicit thresholds"),
])
def test_without_a_budget_the_rate_is_not_judged(version, reason):
    judged = judge_review_rate(WindowCounts(60, 10_000, 5000, 0), version, ALERTS)
    assert judged.state == "not_judged" and reason in judged.reason
    if version is not None:
        assert "no review budget" in judged.reason


def test_too_few_payments_are_not_judged():
    judged = judge_review_rate(WindowCounts(60, 999, 999, 0), live(), ALERTS)
    assert judged.state == "not_judged" and "fewer than alerts.min_payments = 1000" in judged.reason


def test_degraded_after_the_band_is_left_for_the_configured_time_and_back_when_it_returns():
    clock = FakeClock()
    rates = DecisionRates(60, clock)
    check = ReviewRateCheck(ALERTS, rates, live, clock)

    def second_of(payments: int, flagged: int) -> None:
        rates.record(payments, flagged, 0)
        clock.advance(1.0)

    for _ in range(60):
        second_of(100, 1)  # 1%: on budget
    assert check.check().state == "in_band"
    for _ in range(30):
        second_of(100, 5)  # the window's rate climbs past 1.5% within seconds
    first = check.check()
    assert first.state == "outside_band" and first.outside_for_s == 0.0
    for _ in range(119):
        second_of(100, 5)
        check.check()  # the periodic check
    not_yet = check.check()
    assert (not_yet.state, not_yet.outside_for_s) == ("outside_band", 119.0)
    second_of(100, 5)
    degraded = check.check()
    assert degraded.state == "degraded" and degraded.outside_for_s == 120.0
    assert "outside the band [0.500%, 1.500%]" in degraded.reason and "alerts.degraded_after_s = 120" in degraded.reason
    for _ in range(60):
        second_of(100, 1)  # back on budget: the outside seconds leave the window
    back = check.check()
    assert (back.state, back.outside_for_s) == ("in_band", None)


def test_a_quiet_spell_restarts_the_time_outside():
    clock = FakeClock()
    rates = DecisionRates(60, clock)
    check = ReviewRateCheck(ALERTS, rates, live, clock)
    rates.record(1000, 100, 0)
    assert check.check().state == "outside_band"
    clock.advance(100)  # the window empties: nothing to judge
    assert check.check().state == "not_judged"
    rates.record(1000, 100, 0)
    clock.advance(30)
    assert check.check().outside_for_s == 0.0  # counted afresh, not from the first time
