"""End of a run (rank 0): calibrate the best weights on validation, export the model, write the
validation scores and, last, summary.json. A kill before summary.json leaves a run that a restart
finalises again from the same best checkpoint (every step here is idempotent).

Takes what the training loop measured as a :class:`TrainingOutcome`, not the Trainer, so it
depends only on the components it uses (checkpoints, dataset, loss) and is testable alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

from models.fraud_mlp import FraudModel, save_model
from pipeline.atomic import atomic_path, staged_dir
from pipeline.datasets.manifest import DatasetManifest
from pipeline.decisions.operating_points import (
    DecisionBudget,
    choose_operating_points,
    write_operating_points,
)
from pipeline.training.blend import blend_network
from pipeline.training.calibration import Calibration, apply_calibration, fit_calibration
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.config import BlendConfig, CompressionConfig
from pipeline.training.evaluate import ScoredSplit, score_split, scores_table, split_metrics
from pipeline.training.export import load_checkpoint_model
from pipeline.training.run_dir import (
    COMPLETED,
    BlendSummary,
    CompressionSummary,
    DatasetRef,
    RunDir,
    RunSummary,
)


@dataclass(frozen=True)
class TrainingOutcome:
    """What the training loop hands to finalisation (rank 0, after the loop)."""

    global_step: int
    epochs: int  # epochs started (a partly run last epoch counts)
    best_epoch: int
    best_metrics: dict[str, float]  # validation metrics of the best epoch; empty when validation is off
    stopped_early: bool
    skipped_steps: int
    bytes_sent_total: int
    bytes_dense_total: int
    train_samples: int  # samples through the train steps, all ranks
    loop_seconds: float  # time in data loading + train steps (throughput, not wall)
    rank_stats: list[dict[str, float]]  # per rank: peak_rss_mb, loop_cpu_s
    world_size: int
    backend: str
    compression: CompressionConfig
    started_at: float  # time.time() when this attempt started
    epoch_picked_by: str | None = None  # early_stopping.epoch_picked_by


def compression_summary(config: CompressionConfig) -> CompressionSummary:
    return CompressionSummary(config.method, config.density if config.method.startswith("topk") else None)


def finalize_run(run: RunDir, checkpointer: Checkpointer, dataset_root: Path, manifest: DatasetManifest,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 outcome: TrainingOutcome, budget: DecisionBudget, blend: BlendConfig | None = None,
                 seed: int = 0, negative_sample_rate: float = 1.0) -> RunSummary:
    """Calibrate ``best/`` on the validation split, choose the operating points of ``budget`` on the
    calibrated validation scores, write model/, validation scores and summary.json.

    With ``blend.gbm``, a LightGBM booster is fitted (on the network's negative sample at
    ``negative_sample_rate`` < 1, importance-weighted) and stacked with the network by the calibration
    fit (:mod:`.blend`); kept (in ``best/`` and ``model/``) when it ranks validation better out of
    sample (stack cross-fitted over time folds, booster never fitted on validation).

    Side effects, in order: ``best/`` republished with ``calibration.pt`` (and ``gbm.*``), ``model/``
    published whole (weights, booster, ``operating_points.json``), ``validation_scores.parquet``,
    ``summary.json`` (last: its presence means the run finished).
    Returns the summary written.
    """
    calibrated = calibrate_best(checkpointer, dataset_root, manifest, blend, seed, negative_sample_rate)
    metrics = split_metrics(calibrated.scored, loss_fn, calibrated.calibration.temperature,
                            calibrated.calibration.logit_shift)
    probs = calibrated.probabilities()
    publish_model(run, calibrated.model, calibrated.scored.labels, probs, budget)
    with atomic_path(run.validation_scores) as tmp:
        pq.write_table(scores_table(calibrated.scored, probs), tmp)
    summary = run_summary(run, checkpointer, manifest, outcome, calibrated, metrics)
    run.write_summary(summary)
    return summary


@dataclass(frozen=True)
class CalibratedBest:
    """The best weights calibrated on validation: the model (calibration applied), its validation
    scores (log-odds before calibration; the blend's when blended), the calibration, the blend's report."""

    model: FraudModel
    scored: ScoredSplit
    calibration: Calibration
    blended: BlendSummary | None

    def probabilities(self) -> np.ndarray:
        """Calibrated validation probabilities (float64)."""
        logits = torch.from_numpy(self.scored.logits).double()
        return torch.sigmoid((logits + self.calibration.logit_shift) / self.calibration.temperature).numpy()


def calibrate_best(checkpointer: Checkpointer, dataset_root: Path, manifest: DatasetManifest,
                   blend: BlendConfig | None, seed: int, negative_sample_rate: float = 1.0) -> CalibratedBest:
    """Score ``best/`` on validation, fit the calibration (stacked with a LightGBM booster when
    ``blend.gbm``), republish ``best/`` with it (``calibration.pt``, ``gbm.*``) and apply it to the model.
    Idempotent: the stored calibration is ignored and refitted from the same best weights."""
    model = load_checkpoint_model(checkpointer.best, apply_stored_calibration=False)
    model.gbm = None  # refitted below (a restart finalises again from the same best weights)
    scored = score_split(model, dataset_root, manifest, "validation", 0, 1, torch.device("cpu"))
    calibration = fit_calibration(torch.from_numpy(scored.logits), torch.from_numpy(scored.labels).float())
    blended = None
    if blend is not None and blend.gbm:
        calibration, blended, logits = blend_network(model, scored, dataset_root, manifest, blend, seed, calibration,
                                                     negative_sample_rate)
        scored = dataclasses.replace(scored, logits=logits)  # the blend's log-odds on the network's scale
    checkpointer.save_calibrated(calibration.temperature, calibration.logit_shift, model.gbm)
    apply_calibration(model, calibration)
    return CalibratedBest(model, scored, calibration, blended)


def publish_model(run: RunDir, model: FraudModel, labels: np.ndarray, probs: np.ndarray,
                  budget: DecisionBudget) -> None:
    """Publish ``run.model`` whole: the calibrated weights and the operating points of ``budget``
    chosen on the validation ``probs``, so a reader of model/ finds weights with their own thresholds."""
    with staged_dir(run.model) as staging:
        save_model(model, staging)
        write_operating_points(staging, choose_operating_points(labels, probs, budget))


def run_summary(run: RunDir, checkpointer: Checkpointer, manifest: DatasetManifest, outcome: TrainingOutcome,
                calibrated: CalibratedBest, metrics: dict[str, float]) -> RunSummary:
    """The run's summary (finished now): the loop's ``outcome``, the calibration and the calibrated
    validation ``metrics`` (the best metrics when validation was off during training). Pure but for the clock."""
    rss = [r["peak_rss_mb"] for r in outcome.rank_stats]
    finished_at = time.time()
    return RunSummary(
        status=COMPLETED,
        run_name=run.name,
        global_step=outcome.global_step,
        epochs=outcome.epochs,
        best_epoch=outcome.best_epoch,
        epoch_picked_by=outcome.epoch_picked_by,
        best_metrics=dict(outcome.best_metrics or metrics),
        temperature=calibrated.calibration.temperature,
        logit_shift=calibrated.calibration.logit_shift,
        calibrated_ece=metrics["ece"],
        bytes_sent_total=outcome.bytes_sent_total,
        bytes_dense_total=outcome.bytes_dense_total,
        compression=compression_summary(outcome.compression),
        world_size=outcome.world_size,
        backend=outcome.backend,
        started_at=outcome.started_at,
        finished_at=finished_at,
        wall_s=round(finished_at - outcome.started_at, 3),
        peak_rss_mb=max(rss),
        peak_rss_mb_per_rank=tuple(rss),
        train_cpu_s_per_rank=tuple(r["loop_cpu_s"] for r in outcome.rank_stats),
        train_samples=outcome.train_samples,
        stopped_early=outcome.stopped_early,
        skipped_steps=outcome.skipped_steps,
        train_samples_per_s=(outcome.train_samples / outcome.loop_seconds if outcome.loop_seconds
                             else float("nan")),
        checkpoint_dir=str(checkpointer.directory),
        model_dir=str(run.model),
        dataset=DatasetRef(manifest.dataset, manifest.version, manifest.content_hash),
        validation_rows=int(np.asarray(calibrated.scored.labels).size),
        blend=calibrated.blended,
    )
