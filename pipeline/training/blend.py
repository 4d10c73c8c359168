"""The boosted half of a blended model, fitted at the end of a run (rank 0, in finalisation).

LightGBM trains on the train split's rows as the network reads them (the same reader, so the same
inputs: numeric features, then categorical codes as LightGBM categoricals). When the network trains
on a negative sample (``[data] negative_sample_rate`` < 1), so does the booster: every fraud and a
seeded share ``rate`` of the genuine rows, so the fit costs about ``rate`` of the unsampled one. It
fits that sample as it is (``[blend] weigh_sampled_negatives`` off): its raw score is then raised by
about ``-log(rate)``, a constant the stack's fitted shift takes out. Importance weights (``1 / rate``
per kept genuine row, as the network's loss has) stopped it after a few dozen trees on a noisy
weighted log-loss and ranked validation worse than the unweighted fit (the config's comment has
the measurement). Its raw score on
validation enters the calibration fit beside the network's logit
(:func:`pipeline.training.calibration.fit_calibration` with ``extra``): one fit gives the
temperature, the shift and the booster's weight, so the blend is calibrated by construction.

Three decisions are made, each on rows the others did not fit on:

1. **When the booster stops**: on the log-loss of the latest ``early_stopping_share`` of the train
   rows by event time, which the booster does not train on. Validation is never shown to the booster,
   so its score on validation is out of sample. The latest rows, because they are the train rows
   closest in time to validation and to what the model will score; rows are ordered by event time
   (not file order: shards within a date need not be time-ordered). With ``refit_all_train``, the
   booster is then trained again on every train row, those latest ones too, for the number of
   rounds they chose: the rows nearest the scored ones are in the fit, and validation is still unseen.
2. **The stacking weight**: cross-fitted. Validation is cut into ``stacking_folds`` time-contiguous
   folds holding equal numbers of frauds (so each has some, however short validation is); each fold
   is scored by the stack fitted on the other folds. The out-of-fold scores are compared on the
   network's scale (``z + T_f * w_f * boosted``), so the network's part is the same in every fold and
   only the booster's fitted weight differs between them.
3. **Keep or not**: the blend is kept when its out-of-fold validation AP beats the network's AP on
   the same rows by more than ``min_ap_gain``. The network's AP needs no cross-fitting: a calibration
   (``a > 0``, a shift) does not change its ranking. The uncertainty of the gain (a paired bootstrap
   resampling whole cards, since a card's payments are scored alike and its frauds come together) is
   recorded in summary.json beside the decision, not used as the rule: a 3-parameter stack of a
   booster that was never fitted on validation is rarely worse than the network on later days, and
   demanding a significant gain on one validation day would drop the blend where it helps.

Once kept, the shipped weights are fitted again on all of validation. That is not a second look at the
decision: the decision was made out of sample, and the refit only estimates the same three
parameters from twice the rows, as the network's calibration alone is fitted on all of validation.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.fraud_mlp import FraudModel
from models.gbm import GbmTerm
from pipeline.datasets.manifest import DatasetManifest
from pipeline.metrics import average_precision, paired_bootstrap_difference
from pipeline.training.calibration import Calibration, fit_calibration
from pipeline.training.config import BlendConfig
from pipeline.training.data import iter_eval_chunks
from pipeline.training.evaluate import ScoredSplit
from pipeline.training.run_dir import BlendSummary
from pipeline.training.sampling import importance_weights

log = logging.getLogger(__name__)

GAIN_CONFIDENCE = 0.95  # two-sided level of the recorded interval of the AP gain


@dataclass(frozen=True)
class SplitRows:
    """A split's model inputs as :func:`.evaluate.score_split` scores them (the same order)."""

    inputs: np.ndarray  # float64 [n, F + C]: numeric features, then categorical codes
    labels: np.ndarray  # float [n]
    event_times: np.ndarray  # int64 [n], microseconds since the epoch
    weights: np.ndarray  # float64 [n]: 1, or 1 / negative_share for a sampled genuine row

    def take(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(inputs, labels, weights) of ``rows`` (a mask or indices)."""
        return self.inputs[rows], self.labels[rows], self.weights[rows]


def read_split_rows(root: Path, manifest: DatasetManifest, split: str, keep_share: float = 1.0,
                    seed: int = 0, negative_share: float = 1.0, weigh_negatives: bool = True) -> SplitRows:
    """``split``'s rows in file order; with ``keep_share < 1`` a seeded Bernoulli sample of them (the
    booster's training rows of a large split). With ``negative_share < 1``, of those every fraud and a
    seeded Bernoulli share ``negative_share`` of the genuine rows, weighted ``1 / negative_share`` when
    ``weigh_negatives`` (else every row weighs 1)."""
    rng = np.random.default_rng(seed)
    xs, ys, ts, ws = [], [], [], []
    time_column = manifest.id_columns[2]
    for batch, ids in iter_eval_chunks(root, manifest, split, 0, 1, with_ids=True):
        x = np.concatenate([batch.numeric.numpy().astype(np.float64), batch.categorical.numpy().astype(np.float64)],
                           axis=1)
        y = batch.label.numpy()
        t = ids.column(time_column).to_numpy().astype("datetime64[us]").astype(np.int64)
        w = importance_weights(y, negative_share if weigh_negatives else 1.0)
        if keep_share < 1.0 or negative_share < 1.0:
            keep = rng.random(len(y)) < keep_share * np.where(y > 0.5, 1.0, negative_share)
            x, y, t, w = x[keep], y[keep], t[keep], w[keep]
        xs.append(x)
        ys.append(y)
        ts.append(t)
        ws.append(w)
    if not xs:
        width = len(manifest.numeric_features) + len(manifest.categorical_features)
        return SplitRows(np.zeros((0, width)), np.zeros(0), np.zeros(0, np.int64), np.zeros(0))
    return SplitRows(np.concatenate(xs), np.concatenate(ys), np.concatenate(ts), np.concatenate(ws))


def latest_rows(event_times: np.ndarray, share: float) -> np.ndarray:
    """Mask of the ``ceil(share * n)`` rows with the latest event times (ties: the later in file order)."""
    order = np.argsort(event_times, kind="stable")
    mask = np.zeros(len(event_times), dtype=bool)
    mask[order[len(order) - int(np.ceil(share * len(order))):]] = True
    return mask


def time_folds(event_times: np.ndarray, labels: np.ndarray, folds: int) -> np.ndarray:
    """Fold index (``0 .. folds-1``) per row: time-contiguous blocks, in time order, holding equal
    numbers of positives (within one), each ending at its last positive; every fold holds one at
    least when there are ``folds``."""
    order = np.argsort(event_times, kind="stable")
    positives = int(labels.sum())
    ordered = labels[order].astype(np.int64)
    before = np.cumsum(ordered) - ordered  # positives earlier in time than each row
    fold = np.empty(len(order), dtype=np.int64)
    fold[order] = np.minimum(before * folds // max(positives, 1), folds - 1)
    return fold


def cross_fit_stack(network_logits: np.ndarray, boosted: np.ndarray, labels: np.ndarray,
                    folds: np.ndarray) -> np.ndarray:
    """Out-of-fold blended log-odds on the network's scale: each fold's rows scored as
    ``z + T * w * boosted`` with ``T, w`` fitted (calibration with ``extra``) on the other folds only."""
    z, g, y = (torch.from_numpy(np.asarray(a, dtype=np.float64)) for a in (network_logits, boosted, labels))
    out = np.asarray(network_logits, dtype=np.float64).copy()
    for fold in np.unique(folds):
        fit = torch.from_numpy(folds != fold)
        stack = fit_calibration(z[fit], y[fit], extra=g[fit])
        scored = folds == fold
        out[scored] += stack.temperature * stack.extra_weight * np.asarray(boosted, dtype=np.float64)[scored]
    return out


def fit_booster(manifest: DatasetManifest, train: SplitRows, stopping: np.ndarray, config: BlendConfig,
                seed: int) -> GbmTerm:
    """LightGBM on the train rows outside ``stopping`` (a mask), early-stopped on the ``stopping``
    rows' weighted log-loss; with ``config.refit_all_train``, trained again on every train row for
    the rounds that fit stopped at (module doc, 1). Weight 1 (the calibration sets it)."""
    import lightgbm as lgb

    features = (*manifest.numeric_features, *manifest.categorical_features)
    categorical = tuple(range(len(manifest.numeric_features), len(features)))
    params = config.lightgbm_params(seed)

    def dataset(rows: np.ndarray | slice) -> lgb.Dataset:
        x, y, w = train.take(rows)
        return lgb.Dataset(x, y, weight=w, feature_name=list(features), categorical_feature=list(categorical),
                           free_raw_data=True)

    fit = dataset(~stopping)
    stop_x, stop_y, stop_w = train.take(stopping)
    booster = lgb.train(params, fit, num_boost_round=config.max_rounds,
                        valid_sets=[fit.create_valid(stop_x, stop_y, weight=stop_w)],
                        callbacks=[lgb.early_stopping(config.early_stopping_rounds, verbose=False)])
    best = booster.best_iteration or booster.current_iteration()
    if config.refit_all_train:
        del booster, fit, stop_x, stop_y, stop_w  # the first fit's rows go before the second bins every row
        booster = lgb.train(params, dataset(slice(None)), num_boost_round=best)
    return GbmTerm(booster, 1.0, features, categorical, best)


def keep_rule(config: BlendConfig) -> str:
    return (f"keep when the blend's out-of-fold validation AP ({config.stacking_folds} time folds) "
            f"exceeds the network's by more than min_ap_gain = {config.min_ap_gain:g}")


def judge_blend(labels: np.ndarray, network_logits: np.ndarray, out_of_fold: np.ndarray, card_ids: np.ndarray,
                config: BlendConfig, seed: int) -> BlendSummary:
    """The keep decision and its evidence (``trees``, ``gbm_weight``, ``train_rows`` and
    ``early_stopping_rows`` left 0 / None for the caller to fill): out-of-fold blend AP against the
    network's on the same rows, and a card-clustered paired bootstrap interval of the gain."""
    network_ap = average_precision(labels, network_logits)
    blend_ap = average_precision(labels, out_of_fold)
    gain = paired_bootstrap_difference(labels, out_of_fold, network_logits, "average_precision", clusters=card_ids,
                                       resamples=config.bootstrap_resamples, confidence=GAIN_CONFIDENCE, seed=seed)
    kept = bool(blend_ap - network_ap > config.min_ap_gain)
    return BlendSummary(kept, 0, 0.0, network_ap, blend_ap, 0, stacking_folds=config.stacking_folds,
                        decision_rows=len(labels), decision_positives=int(labels.sum()),
                        ap_gain=blend_ap - network_ap, ap_gain_lower=gain.lower, ap_gain_upper=gain.upper,
                        ap_gain_confidence=GAIN_CONFIDENCE, bootstrap_resamples=config.bootstrap_resamples,
                        bootstrap_cards=gain.units, rule=keep_rule(config))


def _rows(manifest: DatasetManifest, split: str) -> int:
    return sum(s.rows for s in manifest.shards_for(split))


def _both_classes(labels: np.ndarray, at_least: int = 1) -> bool:
    return at_least <= labels.sum() < len(labels)


def blend_network(model: FraudModel, scored: ScoredSplit, root: Path, manifest: DatasetManifest,
                  config: BlendConfig, seed: int, calibration: Calibration,
                  negative_sample_rate: float = 1.0) -> tuple[Calibration, BlendSummary, np.ndarray]:
    """Fit the booster (on every fraud and ``negative_sample_rate`` of the genuine train rows,
    importance-weighted: module docstring), judge the stack with ``scored`` (validation, uncalibrated logits) out of sample
    and, when kept, set ``model.gbm`` and return the blend's calibration (refitted on all of validation)
    and validation's logits on the network's scale (``z + T * w * boosted``: calibrating them with the
    returned calibration gives the blend's probabilities); else return ``calibration`` (the network's
    own) and ``scored.logits``, and leave the model as it is. The summary records the evidence."""
    total = _rows(manifest, "train")
    train = read_split_rows(root, manifest, "train", min(1.0, config.max_train_rows / total) if total else 1.0, seed,
                            negative_sample_rate, config.weigh_sampled_negatives)
    stopping = latest_rows(train.event_times, config.early_stopping_share)
    validation = read_split_rows(root, manifest, "validation")
    if len(validation.labels) != len(scored.labels):
        raise ValueError(f"blend: validation read {len(validation.labels)} rows, the network scored "
                         f"{len(scored.labels)}: both must read the split whole, in file order")
    labels = scored.labels.astype(np.float64)
    refused = ("train rows the booster fits" if not _both_classes(train.labels[~stopping]) else
               "early-stopping rows" if not _both_classes(train.labels[stopping]) else
               f"validation (needs {config.stacking_folds} frauds, one per fold)"
               if not _both_classes(labels, config.stacking_folds) else None)
    if refused:
        log.warning("blend: the %s hold one class only; the network alone is kept", refused)
        return calibration, BlendSummary(False, 0, 0.0, float("nan"), float("nan"), int((~stopping).sum()),
                                         early_stopping_rows=int(stopping.sum()),
                                         rule=f"network alone: the {refused} hold one class only"), scored.logits
    term = fit_booster(manifest, train, stopping, config, seed)
    boosted = term.logit(validation.inputs[:, :len(manifest.numeric_features)],
                         validation.inputs[:, len(manifest.numeric_features):])
    out_of_fold = cross_fit_stack(scored.logits, boosted, labels,
                                  time_folds(validation.event_times, labels, config.stacking_folds))
    judged = judge_blend(labels, scored.logits, out_of_fold, scored.card_ids, config, seed)
    shipped = fit_calibration(torch.from_numpy(scored.logits).double(), torch.from_numpy(labels),
                              extra=torch.from_numpy(boosted))
    outcome = dataclasses.replace(judged, trees=term.best_iteration,
                                  train_rows=len(stopping) if config.refit_all_train else int((~stopping).sum()),
                                  early_stopping_rows=int(stopping.sum()), refit_all_train=config.refit_all_train,
                                  gbm_weight=shipped.extra_weight if judged.kept else 0.0)
    log.info("blend: out-of-fold validation AP network %.4f, blend %.4f (gain %+.4f, %d%% interval %+.4f..%+.4f; "
             "%d trees, weight %.3f): %s", outcome.validation_ap_network, outcome.validation_ap_blend,
             outcome.ap_gain, round(100 * GAIN_CONFIDENCE), outcome.ap_gain_lower, outcome.ap_gain_upper,
             term.best_iteration, shipped.extra_weight, "kept" if outcome.kept else "network alone")
    if not outcome.kept:
        return calibration, outcome, scored.logits
    model.gbm = term.with_weight(shipped.extra_weight)
    on_network_scale = scored.logits + shipped.temperature * shipped.extra_weight * boosted
    return shipped, outcome, on_network_scale.astype(np.float32)
