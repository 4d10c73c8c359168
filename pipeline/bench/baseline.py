"""``fraudctl bench baseline``: our DDP-trained model vs LightGBM on the same features and split.

Both train on the dataset's train split and use its validation split (early stopping; for ours
also calibration); both are scored on the held-out test split with the metrics of
pipeline/metrics.py. ``train_s`` is wall time of training (ours: the whole torchrun job with
2 processes on this machine; LightGBM: ``lgb.train`` with 1 thread).
"""

from __future__ import annotations

import dataclasses
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd
import torch

from models.fraud_mlp import frame_to_tensors, load_model
from pipeline.bench.dataset import bench_dataset_root
from pipeline.bench.train import BENCH_MODEL, run_bench_training
from pipeline.datasets.manifest import DatasetManifest, load_manifest
from pipeline.datasets.reader import read_split
from pipeline.metrics import auc_roc, average_precision, card_precision_at_k
from pipeline.paths import state_dir
from pipeline.training.run_dir import RunDir

EVAL_SPLIT = "test"
# One thread: on shared cores LightGBM's OpenMP threads spin-wait, and 2 threads ran 20x slower than 1 here.
LGB_PARAMS = {"objective": "binary", "learning_rate": 0.05, "num_leaves": 63, "min_data_in_leaf": 50,
              "feature_fraction": 0.9, "bagging_fraction": 0.8, "bagging_freq": 1, "num_threads": 1,
              "verbose": -1, "seed": 7}


def _metrics(frame: pd.DataFrame, manifest: DatasetManifest, scores: np.ndarray) -> dict[str, float]:
    labels = frame[manifest.label_column].to_numpy()
    card_col, time_col = manifest.id_columns[1], manifest.id_columns[2]
    days = pd.to_datetime(frame[time_col], utc=True).dt.strftime("%Y-%m-%d").to_numpy()
    return {"auc_roc": auc_roc(labels, scores), "average_precision": average_precision(labels, scores),
            "card_precision_at_100": card_precision_at_k(labels, scores, frame[card_col].to_numpy(), days, 100)}


def _features(frame: pd.DataFrame, manifest: DatasetManifest) -> pd.DataFrame:
    x = frame[[*manifest.numeric_features, *manifest.categorical_features]].copy()
    for col in manifest.categorical_features:
        x[col] = x[col].fillna(0).astype("int64").astype("category")
    return x


def run_lightgbm(root: Path, manifest: DatasetManifest, test: pd.DataFrame, quick: bool) -> dict[str, Any]:
    train, valid = read_split(root, manifest, "train"), read_split(root, manifest, "validation")
    started = time.time()
    booster = lgb.train(
        LGB_PARAMS, lgb.Dataset(_features(train, manifest), train[manifest.label_column]),
        num_boost_round=200 if quick else 2000,
        valid_sets=[lgb.Dataset(_features(valid, manifest), valid[manifest.label_column])],
        callbacks=[lgb.early_stopping(50, verbose=False)])
    train_s = time.time() - started
    scores = booster.predict(_features(test, manifest), num_iteration=booster.best_iteration)
    return {**_metrics(test, manifest, scores), "train_s": train_s, "trees": booster.best_iteration,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def run_ours(root: Path, manifest: DatasetManifest, test: pd.DataFrame, quick: bool, workdir: Path) -> dict[str, Any]:
    overrides = {
        "model": BENCH_MODEL,
        "data": {"global_batch_size": 512},  # dev's batch: enough optimizer steps to converge
        "checkpoint": {"every_steps": 1_000_000},
        # Early stopping on validation AP decides the real length; 16 epochs is only the ceiling.
        "loop": {"epochs": 3 if quick else 16, "early_stop_patience": 5, "log_every": 50, "threads_per_rank": 1},
    }
    summary, _ = run_bench_training(workdir, "ours", root, 2, overrides)
    model = load_model(RunDir(workdir / "ours").model)
    numeric, categorical = frame_to_tensors(test, model.config)
    with torch.no_grad():
        scores = model.predict_proba(numeric, categorical).numpy()
    return {**_metrics(test, manifest, scores), "train_s": summary.wall_s, "epochs": summary.epochs,
            "compression": dataclasses.asdict(summary.compression), "peak_rss_mb_per_rank": summary.peak_rss_mb_per_rank}


def run(quick: bool) -> dict[str, Any]:
    root, source = bench_dataset_root(quick)
    manifest = load_manifest(root)
    test = read_split(root, manifest, EVAL_SPLIT)
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        ours = run_ours(root, manifest, test, quick, Path(tmp))
    lightgbm = run_lightgbm(root, manifest, test, quick)
    return {
        "dataset": {"root": str(root), "source": source, "version": manifest.version},
        "evaluated_on": EVAL_SPLIT, "rows": len(test), "frauds": int(test[manifest.label_column].sum()),
        "goal": "ours >= lightgbm on average_precision",
        "ours": ours, "lightgbm": lightgbm,
    }
