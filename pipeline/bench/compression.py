"""``fraudctl bench compression``: dense all-reduce vs top-k with and without error feedback.

Same dataset, model, global batch, epochs and seed for every run (2 processes, gloo). Bytes are
those the communication hook handed to collectives (measured, per rank and step), averaged over
the steps after the dense and sparsity warm-ups; ``bytes_ratio`` = dense bytes / these bytes.
Quality is the best epoch's validation AUC-ROC and average precision.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

from pipeline.bench.dataset import bench_dataset_root
from pipeline.bench.train import BENCH_MODEL, run_bench_training
from pipeline.paths import state_dir

VARIANTS: list[tuple[str, str, float | None]] = [  # (reported method, compression.method, density)
    ("dense", "allreduce", None),
    ("topk_ef", "topk_ef", 0.01),
    ("topk_ef", "topk_ef", 0.001),
    ("topk", "topk", 0.01),
    ("topk", "topk", 0.001),
]
DENSE_WARMUP_STEPS = {False: 20, True: 2}  # by quick
DENSITY_WARMUP_EPOCHS = {False: 1.0, True: 0.5}


def _steady_bytes(steps: list[dict[str, Any]], after_step: int) -> float:
    steady = [s["bytes_sent"] for s in steps if s["step"] > after_step]
    return statistics.fmean(steady) if steady else float("nan")


def run(quick: bool) -> dict[str, Any]:
    root, source = bench_dataset_root(quick)
    epochs = 2 if quick else 5
    dense_warmup, density_warmup = DENSE_WARMUP_STEPS[quick], DENSITY_WARMUP_EPOCHS[quick]
    results = []
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        for method, hook, density in VARIANTS:
            overrides = {
                "model": BENCH_MODEL,
                "data": {"global_batch_size": 4096},
                "compression": {"method": hook, "density": density or 1.0, "dense_warmup_steps": dense_warmup,
                                "density_warmup_epochs": density_warmup},
                "checkpoint": {"every_steps": 1_000_000},
                "loop": {"epochs": epochs, "early_stop_patience": 1000, "log_every": 1, "threads_per_rank": 1},
            }
            name = f"{method}-{density}"
            summary, steps = run_bench_training(Path(tmp), name, root, 2, overrides)
            steps_per_epoch = summary.global_step // epochs
            warm = dense_warmup + round(density_warmup * steps_per_epoch)
            results.append({
                "method": method, "density": density,
                "bytes_per_step": _steady_bytes(steps, warm if density else 0),
                "bytes_per_step_all_steps": summary.bytes_sent_total / summary.global_step,
                "auc": summary.best_metrics["auc_roc"],
                "average_precision": summary.best_metrics["average_precision"],
                "best_epoch": summary.best_epoch,
                "steps": summary.global_step,
                "samples_per_s": summary.train_samples_per_s,
                "peak_rss_mb_per_rank": summary.peak_rss_mb_per_rank,
            })
    dense = results[0]
    for r in results:
        r["bytes_ratio"] = dense["bytes_per_step"] / r["bytes_per_step"]
        r["auc_delta_vs_dense"] = r["auc"] - dense["auc"]
    return {
        "dataset": {"root": str(root), "source": source},
        "processes": 2, "epochs": epochs, "global_batch_size": 4096,
        "dense_warmup_steps": dense_warmup, "density_warmup_epochs": density_warmup,
        "bytes_note": "per rank and step, after the warm-ups; values (fp32) + indices (int32) for top-k",
        "goal": ">= 300x fewer bytes at density 0.001 with AUC within 0.002 of dense",
        "runs": results,
    }
