"""The boosted half of a blended model, fitted at the end of a run (rank 0, in finalisation).

LightGBM trains on the train split's rows as the network reads them (the same reader, so the same
inputs: numeric features, then categorical codes as LightGBM categoricals), early-stopped on
validation's log-loss. Its raw score on validation then enters the calibration fit beside the
network's logit (:func:`pipeline.training.calibration.fit_calibration` with ``extra``): one fit
gives the temperature, the shift and the booster's weight, so the blend is calibrated by
construction. The blend is kept only when it ranks validation better than the network alone
(average precision, by more than ``min_ap_gain``); the decision and both figures go into the
run's summary.

Measured on ``fraudctl bench baseline``'s portfolios (one seed; validation / protocol-holdout AP,
network alone -> blend): default 0.374 -> 0.380 / 0.469 -> 0.507; high-fraud 0.474 -> 0.481 /
0.519 -> 0.528; e-commerce 0.299 -> 0.298 / 0.385 -> 0.380 (there validation says no, and the rule
keeps the network alone).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from models.fraud_mlp import FraudModel
from models.gbm import GbmTerm
from pipeline.datasets.manifest import DatasetManifest
from pipeline.metrics import average_precision
from pipeline.training.calibration import Calibration, fit_calibration
from pipeline.training.config import BlendConfig
from pipeline.training.data import iter_eval_chunks
from pipeline.training.run_dir import BlendSummary

log = logging.getLogger(__name__)


def split_inputs(root: Path, manifest: DatasetManifest, split: str, keep_share: float = 1.0,
                 seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``split``'s model inputs as one float64 matrix ``[n, F + C]`` (numeric, then categorical codes)
    and its labels, in the order :func:`.evaluate.score_split` scores them; with ``keep_share < 1`` a
    seeded Bernoulli sample of the rows (the booster's training rows of a large split)."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for batch, _ in iter_eval_chunks(root, manifest, split, 0, 1):
        x = np.concatenate([batch.numeric.numpy().astype(np.float64), batch.categorical.numpy().astype(np.float64)],
                           axis=1)
        y = batch.label.numpy()
        if keep_share < 1.0:
            keep = rng.random(len(y)) < keep_share
            x, y = x[keep], y[keep]
        xs.append(x)
        ys.append(y)
    width = len(manifest.numeric_features) + len(manifest.categorical_features)
    return (np.concatenate(xs) if xs else np.zeros((0, width))), (np.concatenate(ys) if ys else np.zeros(0))


def fit_booster(manifest: DatasetManifest, train: tuple[np.ndarray, np.ndarray],
                validation: tuple[np.ndarray, np.ndarray], config: BlendConfig, seed: int) -> GbmTerm:
    """LightGBM on ``train``, early-stopped on ``validation``; weight 1 (the calibration sets it)."""
    import lightgbm as lgb

    features = (*manifest.numeric_features, *manifest.categorical_features)
    categorical = tuple(range(len(manifest.numeric_features), len(features)))
    dataset = lgb.Dataset(train[0], train[1], feature_name=list(features), categorical_feature=list(categorical),
                          free_raw_data=True)
    booster = lgb.train(config.lightgbm_params(seed), dataset, num_boost_round=config.max_rounds,
                        valid_sets=[dataset.create_valid(validation[0], validation[1])],
                        callbacks=[lgb.early_stopping(config.early_stopping_rounds, verbose=False)])
    best = booster.best_iteration or booster.current_iteration()
    return GbmTerm(booster, 1.0, features, categorical, best)


def _rows(manifest: DatasetManifest, split: str) -> int:
    return sum(s.rows for s in manifest.shards_for(split))


def blend_network(model: FraudModel, network_logits: np.ndarray, labels: np.ndarray, root: Path,
                  manifest: DatasetManifest, config: BlendConfig, seed: int,
                  calibration: Calibration) -> tuple[Calibration, BlendSummary, np.ndarray]:
    """Fit the booster, stack it with ``network_logits`` (validation, uncalibrated) and, when the blend
    ranks validation better, set ``model.gbm`` and return the blend's calibration and validation's
    logits on the network's scale (``z + T * w * boosted``: calibrating them with the returned
    calibration gives the blend's probabilities); else return ``calibration`` (the network's own) and
    ``network_logits``, and leave the model as it is."""
    total = _rows(manifest, "train")
    train = split_inputs(root, manifest, "train", min(1.0, config.max_train_rows / total) if total else 1.0, seed)
    validation = split_inputs(root, manifest, "validation")
    if not 0 < validation[1].sum() < len(validation[1]) or not 0 < train[1].sum() < len(train[1]):
        log.warning("blend: train or validation holds one class only; the network alone is kept")
        return calibration, BlendSummary(False, 0, 0.0, float("nan"), float("nan"), len(train[1])), network_logits
    term = fit_booster(manifest, train, validation, config, seed)
    boosted = term.logit(validation[0][:, :len(manifest.numeric_features)],
                         validation[0][:, len(manifest.numeric_features):])
    z, y = torch.from_numpy(network_logits).double(), torch.from_numpy(labels).double()
    blended = fit_calibration(z, y, extra=torch.from_numpy(boosted))
    network_ap = average_precision(labels, network_logits)
    blend_ap = average_precision(labels, network_logits / blended.temperature + blended.extra_weight * boosted)
    kept = blend_ap > network_ap + config.min_ap_gain
    outcome = BlendSummary(kept, term.best_iteration, blended.extra_weight if kept else 0.0, network_ap, blend_ap,
                           len(train[1]))
    log.info("blend: validation AP network %.4f, blend %.4f (%d trees, weight %.3f): %s", network_ap, blend_ap,
             term.best_iteration, blended.extra_weight, "kept" if kept else "network alone")
    if not kept:
        return calibration, outcome, network_logits
    model.gbm = term.with_weight(blended.extra_weight)
    on_network_scale = network_logits + blended.temperature * blended.extra_weight * boosted
    return blended, outcome, on_network_scale.astype(np.float32)
