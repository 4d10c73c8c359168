"""The baseline bench's calibration figures: how far a model's probabilities are from the fraud rate
on validation (where ours is calibrated) and on the protocol's test week, without and with the
prior-shift correction of :mod:`pipeline.decisions.prior_shift`, replayed as production could run it.

Production's view: each test day's prior is estimated by EM from the unlabeled scores of the test
days before it (the previous 1 or 7 days), never from labels nor from the day's own scores. The
dataset holds no rows of the gap before the test week, so the first test day keeps the source prior
(production would have had the gap's scores). Test rows are those the protocol evaluates
(:func:`evaluated_rows`), so the test week's ECE here is the protocol's ``ece``.

The source prior is the model's mean validation score: for ours, calibrated on validation with a
bias term, that is validation's fraud rate; for a model fit elsewhere (LightGBM on train) it is the
rate its probabilities imply on validation, so a test week like validation gets no correction.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from pipeline.decisions.prior_shift import prior_corrected_scores, trailing_priors
from pipeline.evaluation.holdout import Holdout
from pipeline.evaluation.protocol import known_compromised_rows
from pipeline.metrics import calibration_curve, expected_calibration_error

LOOKBACK_DAYS = (1, 7)  # days of earlier scores behind each day's prior estimate
HEADLINE_LOOKBACK_DAYS = 7  # the corrected ECE reported beside the others: a week evens out daily noise


def evaluated_rows(holdout: Holdout) -> np.ndarray:
    """The holdout rows the protocol's figures are computed on (``ece`` among them): those of cards not
    found compromised by a report earlier in the test week (the rule of
    :func:`pipeline.evaluation.protocol.evaluate_protocol`)."""
    frame = holdout.frame.assign(label=holdout.labels)
    return ~known_compromised_rows(frame, label_delay=holdout.label_delay)


def utc_days(event_time: pd.Series) -> np.ndarray:
    """Each row's UTC calendar day as ``datetime64[D]``."""
    return pd.DatetimeIndex(pd.to_datetime(event_time, utc=True)).tz_localize(None).to_numpy().astype("datetime64[D]")


def calibration_figures(validation_labels: np.ndarray, validation_scores: np.ndarray, test_labels: np.ndarray,
                        test_scores: np.ndarray, test_days: np.ndarray, curves: bool) -> dict[str, Any]:
    """``ece_validation``, ``ece_test_prior_corrected`` (previous 7 days) and a ``calibration`` block:
    the source prior and, for validation, the test week and the test week corrected with each
    lookback, the fraud rate, mean score, ECE and (``curves``) the binned calibration curve; for the
    corrected test week also each day's fraud rate beside the prior estimated for it."""
    source_prior = float(np.mean(validation_scores))
    corrected = {}
    for lookback in LOOKBACK_DAYS:
        scores = prior_corrected_scores(test_days, test_scores, source_prior, lookback)
        priors = trailing_priors(test_days, test_scores, source_prior, lookback)
        corrected[f"previous_{lookback}_days"] = {
            **_split_figures(test_labels, scores, curves),
            "days": [{"day": str(day), "fraud_rate": float(test_labels[test_days == day].mean()),
                      "mean_score": float(test_scores[test_days == day].mean()), "prior_estimate": prior}
                     for day, prior in priors.items()],
        }
    return {
        "ece_validation": expected_calibration_error(validation_labels, validation_scores),
        "ece_test_prior_corrected": corrected[f"previous_{HEADLINE_LOOKBACK_DAYS}_days"]["ece"],
        "calibration": {
            "source_prior": source_prior,
            "validation": _split_figures(validation_labels, validation_scores, curves),
            "test": _split_figures(test_labels, test_scores, curves),
            "test_prior_corrected": corrected,
        },
    }


def _split_figures(labels: np.ndarray, scores: np.ndarray, curve: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {"n": int(len(labels)), "fraud_rate": float(np.mean(labels)),
                               "mean_score": float(np.mean(scores)),
                               "ece": expected_calibration_error(labels, scores)}
    if curve:
        figures["curve"] = [dataclasses.asdict(b) for b in calibration_curve(labels, scores)]
    return figures
