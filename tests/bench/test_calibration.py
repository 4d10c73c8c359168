"""The baseline bench's calibration figures on a synthetic scored week whose fraud rate moved after
validation: what each block reports, and that the correction uses only earlier days."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.bench.calibration import calibration_figures, utc_days
from pipeline.metrics import expected_calibration_error

SOURCE_PRIOR, TEST_PRIOR = 0.03, 0.06
DAYS = np.arange(np.datetime64("2026-01-27"), np.datetime64("2026-02-03"))  # a test week


def _scored(rng: np.random.Generator, n: int, prior: float) -> tuple[np.ndarray, np.ndarray]:
    """Labels at ``prior`` and the posteriors of a model calibrated at SOURCE_PRIOR (binormal, AUC ~0.98)."""
    y = rng.random(n) < prior
    x = rng.standard_normal(n) + 3.0 * y
    p = 1 / (1 + np.exp(-(np.log(SOURCE_PRIOR / (1 - SOURCE_PRIOR)) + 3.0 * x - 4.5)))
    return y.astype(np.int64), p


@pytest.fixture(scope="module")
def test_week() -> tuple[np.ndarray, np.ndarray]:
    return _scored(np.random.default_rng(0), 7 * 20_000, TEST_PRIOR)


@pytest.fixture(scope="module")
def figures(test_week) -> dict:
    val_y, val_p = _scored(np.random.default_rng(1), 60_000, SOURCE_PRIOR)
    return calibration_figures(val_y, val_p, *test_week, np.repeat(DAYS, 20_000), curves=True)


def test_validation_and_test_week_are_reported_side_by_side(figures, test_week) -> None:
    test_y, test_p = test_week
    block = figures["calibration"]
    assert block["source_prior"] == pytest.approx(SOURCE_PRIOR, rel=0.1)  # the mean validation score
    assert figures["ece_validation"] == block["validation"]["ece"] < 0.005
    assert block["test"]["ece"] == expected_calibration_error(test_y, test_p) > 0.01
    assert block["test"]["fraud_rate"] == pytest.approx(TEST_PRIOR, rel=0.05)
    curve = block["test"]["curve"]
    assert sum(b["n"] for b in curve) == len(test_y)
    assert all(b["fraud_rate"] >= b["mean_score"] for b in curve if b["n"] > 1000)  # under-confident


def test_the_correction_uses_earlier_days_and_brings_the_test_week_back(figures) -> None:
    corrected = figures["calibration"]["test_prior_corrected"]
    assert set(corrected) == {"previous_1_days", "previous_7_days"}
    week = corrected["previous_7_days"]
    assert figures["ece_test_prior_corrected"] == week["ece"]
    assert week["ece"] < figures["calibration"]["test"]["ece"] / 3
    days = week["days"]
    assert [d["day"] for d in days] == [str(d) for d in DAYS]
    assert days[0]["prior_estimate"] == figures["calibration"]["source_prior"]  # nothing before the first day
    assert all(d["prior_estimate"] == pytest.approx(TEST_PRIOR, rel=0.15) for d in days[1:])


def test_curves_only_when_asked() -> None:
    y, p = _scored(np.random.default_rng(2), 2000, SOURCE_PRIOR)
    figures = calibration_figures(y, p, y, p, np.repeat(DAYS[:2], 1000), curves=False)
    assert "curve" not in figures["calibration"]["validation"]
    assert "curve" not in figures["calibration"]["test_prior_corrected"]["previous_1_days"]


def test_utc_days_of_an_aware_event_time_column() -> None:
    times = pd.Series(pd.to_datetime(["2026-01-27T23:59:59Z", "2026-01-28T00:00:01Z"], utc=True))
    assert list(utc_days(times)) == [np.datetime64("2026-01-27"), np.datetime64("2026-01-28")]
