"""End of a run (rank 0): calibrate the best weights on validation, export the model, write the
validation scores and, last, summary.json. A kill before summary.json leaves a run that a restart
finalises again from the same best checkpoint (every step here is idempotent)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.parquet as pq
import torch

from models.fraud_mlp import save_model
from pipeline.training import run_dir as files
from pipeline.training.calibration import apply_calibration, fit_calibration
from pipeline.training.checkpoint import BEST
from pipeline.training.evaluate import score_split, scores_table, split_metrics
from pipeline.training.export import load_checkpoint_model

if TYPE_CHECKING:
    from pipeline.training.trainer import Trainer


def finalize_run(trainer: Trainer, started: float, rank_stats: list[dict[str, float]]) -> dict[str, Any]:
    run_dir, state, config = trainer.run_dir, trainer.state, trainer.config
    best_dir = trainer.checkpointer.directory / BEST
    model = load_checkpoint_model(best_dir, apply_stored_calibration=False)
    scored = score_split(model, trainer.dataset_root, trainer.manifest, "validation", 0, 1, torch.device("cpu"))
    calibration = fit_calibration(torch.from_numpy(scored.logits), torch.from_numpy(scored.labels).float())
    trainer.checkpointer.save_calibration(calibration.temperature, calibration.logit_shift)
    apply_calibration(model, calibration)
    save_model(model, run_dir / files.MODEL_DIR)
    calibrated = split_metrics(scored, trainer.loss_fn, calibration.temperature, calibration.logit_shift)
    probs = torch.sigmoid((torch.from_numpy(scored.logits).double() + calibration.logit_shift)
                          / calibration.temperature).numpy()
    tmp = run_dir / f".{files.SCORES_FILE}.tmp"
    pq.write_table(scores_table(scored, probs), tmp)
    tmp.replace(run_dir / files.SCORES_FILE)
    best_metrics = state.best_metrics or {k: v for k, v in calibrated.items()}
    summary = {
        "status": "completed",
        "run_name": run_dir.name,
        "global_step": state.global_step,
        "epochs": state.epoch + (1 if state.step_in_epoch else 0),
        "best_epoch": state.best_epoch,
        "best_metrics": best_metrics,
        "temperature": calibration.temperature,
        "logit_shift": calibration.logit_shift,
        "calibrated_ece": calibrated["ece"],
        "bytes_sent_total": state.bytes_sent_total,
        "bytes_dense_total": state.bytes_dense_total,
        "compression": {"method": config.compression.method,
                        "density": config.compression.density if config.compression.method.startswith("topk") else None},
        "world_size": trainer.env.world_size,
        "backend": trainer.env.backend,
        "wall_s": round(time.time() - started, 3),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in rank_stats),
        "peak_rss_mb_per_rank": [r["peak_rss_mb"] for r in rank_stats],
        "train_cpu_s_per_rank": [r["loop_cpu_s"] for r in rank_stats],
        "train_samples": trainer.loop_samples,
        "stopped_early": state.stopped_early,
        "skipped_steps": state.skipped_steps,
        "train_samples_per_s": trainer.loop_samples / trainer.loop_seconds if trainer.loop_seconds else float("nan"),
        "checkpoint_dir": str(trainer.checkpointer.directory),
        "model_dir": str(run_dir / files.MODEL_DIR),
        "dataset": {"name": trainer.manifest.dataset, "version": trainer.manifest.version,
                    "content_hash": trainer.manifest.content_hash},
        "validation_rows": int(np.asarray(scored.labels).size),
    }
    files.write_json_atomic(run_dir / files.SUMMARY_FILE, summary)
    return summary
