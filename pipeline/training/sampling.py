"""Negative sampling of the train split: every fraud, and a seeded share of the genuine payments.

At 0.1-0.5% fraud almost all of an epoch's cost buys genuine rows, so a job keeps every positive
and ``rate`` of the negatives. Which negatives are kept is drawn again each epoch (over the epochs
the model still sees most of them), from a generator keyed by ``(seed, rank, epoch, piece)``, so an
epoch's rows are a pure function of its key and a resumed epoch replays the same ones.

How many rows a piece keeps, ``positives + round(rate * negatives)``, does not depend on the
epoch: steps per epoch are fixed before the first one, as collectives need.

Loss: by default (``[data] weigh_sampled_negatives``) each kept genuine row weighs ``1 / rate``
(importance weights, :func:`pipeline.training.loss.make_loss`'s ``positive_scale``), so the
objective is the unsampled one in expectation. Unweighted, the model's log-odds are raised by
``-log(rate)`` (the prior correction of King and Zeng) and frauds weigh ``1 / rate`` times their
share, a strong positive weighting that ranked worse here. Either way the calibration fitted on the
unsampled validation split (:mod:`pipeline.training.calibration`, its logit shift) puts the exported
model's scores at the full fraud rate; the gate, operating points and ECE are judged on unsampled rows.

Run length: a sampled epoch is about ``rate`` of an unsampled one, and optimizer steps are what
average precision needs most, so a sampled run has its own ``[loop] sampled_epochs`` and validates
every ``sampled_validate_every_epochs``. Scoring the whole validation split costs the same however
short the epoch (two sampled epochs' worth at 0.1 on the bench portfolio), so a sampled run's
per-epoch validation scores every validation fraud and ``[loop] sampled_validation_negative_rate``
of the genuine rows, weighted back (:func:`importance_weights`,
:func:`pipeline.training.evaluate.split_metrics`); the exported epoch is still calibrated on the
whole split.
"""

from __future__ import annotations

import numpy as np


def importance_weights(labels: np.ndarray, rate: float) -> np.ndarray:
    """Per row of a negative sample at ``rate``: 1 for a fraud, ``1 / rate`` for a kept genuine row
    (the genuine rows it stands for)."""
    return np.where(np.asarray(labels) > 0.5, 1.0, 1.0 / rate)


def kept_rows(positives: int, rows: int, rate: float) -> int:
    """Rows a piece of ``rows`` rows with ``positives`` frauds keeps in every epoch."""
    return positives + round(rate * (rows - positives))


def sample_rows(positive_rows: np.ndarray, rows: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted row indices kept from a piece: every index in ``positive_rows`` (sorted) and
    ``round(rate * negatives)`` of the others, drawn without replacement by ``rng``."""
    if rate >= 1.0:
        return np.arange(rows)
    negatives = np.ones(rows, bool)
    negatives[positive_rows] = False
    negative_rows = np.flatnonzero(negatives)
    chosen = rng.choice(negative_rows, size=round(rate * len(negative_rows)), replace=False)
    return np.sort(np.concatenate([positive_rows, chosen]))
