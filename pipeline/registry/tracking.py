"""Log a finished training run directory into MLflow and register its model as ``challenger``.

One MLflow run per training run, as a user of the MLflow UI expects to find it:

* start and end time are those of training (from the summary), not of registering;
* the training dataset is the run's dataset input (name = dataset version, digest = content hash,
  schema = the raw feature columns), so the runs table's Dataset column names it;
* metrics are only series: rank-0 step metrics and per-epoch validation metrics at their global
  step. Single numbers of the run (best-epoch metrics, temperature, byte totals, wall time, ...)
  are tags (``best.*``, ``summary.*``): as metrics they would be one-point charts;
* lineage tags (dataset name, version and content hash, Kafka offset ranges, git commit) on the run
  *and* on the model version, so an operator holding only a version number finds the exact data it
  saw; the whole config as params; PNG plots; the pyfunc model.

Registering the same run directory twice (a retried DAG task) returns the existing version.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from mlflow.data.dataset_source_registry import get_dataset_source_from_json
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Metric, RunStatus
from mlflow.tracking.context.registry import resolve_tags
from mlflow.types import ColSpec, Schema
from mlflow.utils.validation import (
    MAX_DATASET_DIGEST_SIZE,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_TAG_VAL_LENGTH,
)

from pipeline.config import PROJECT_ROOT, flatten
from pipeline.datasets.manifest import LABEL_COLUMN, DatasetManifest
from pipeline.decisions.operating_points import OPERATING_POINTS_FILE, read_operating_points
from pipeline.evaluation import plots
from pipeline.registry.config import RegistryConfig
from pipeline.registry.model_package import feature_columns, log_pyfunc_model, register_version
from pipeline.registry.store import CHALLENGER, connect, ensure_experiment
from pipeline.registry.training_run import TrainingRun, read_training_run
from pipeline.training.run_dir import DATASET_FILE, RunSummary

log = logging.getLogger(__name__)

STEP_METRICS = ("loss", "lr", "density", "bytes_sent", "bytes_dense", "samples_per_s", "skipped_steps")
EPOCH_METRICS = ("auc_roc", "average_precision", "recall_at_1pct_fpr", "card_precision_at_100", "ece")
FINGERPRINT_TAG = "fraud.run_fingerprint"
CONTENT_HASH_TAG = "dataset.content_hash"  # full hash (a dataset input's digest holds only its start)
RUN_ARTIFACTS = "run"  # artifact folder holding the run directory's JSON files
DATASET_CONTEXT = "training"  # mlflow.data.context of the training dataset input
# Summary numbers that are not results: the run's own start and end time.
NOT_SUMMARY_FIGURES = ("started_at", "finished_at")


def git_commit() -> str:
    """HEAD of the project checkout doing the registering (training and registering share it)."""
    try:
        out = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def dataset_lineage_tags(manifest: DatasetManifest, dataset_root: Path | None) -> dict[str, str]:
    """Where a model's data came from: enough to find and rebuild the exact training set."""
    offsets = json.dumps(manifest.kafka_offsets, sort_keys=True, separators=(",", ":"))
    if len(offsets) > MAX_TAG_VAL_LENGTH:  # very many partitions: the full map is in the dataset.json artifact
        offsets = f"too long for a tag: see artifact {RUN_ARTIFACTS}/{DATASET_FILE}"
    return {
        "dataset.name": manifest.dataset,
        "dataset.version": manifest.version,
        CONTENT_HASH_TAG: manifest.content_hash,
        "dataset.kafka_offsets": offsets,
        "dataset.splits": json.dumps({k: [w.start, w.end] for k, w in manifest.splits.items()}, sort_keys=True),
        "dataset.label_cutoff": manifest.label_cutoff,
        "dataset.root": str(dataset_root or ""),
    }


def code_lineage_tags(training_config: dict[str, Any]) -> dict[str, str]:
    commit = str(training_config.get("git_commit") or git_commit())
    return {"git.commit": commit, "mlflow.source.git.commit": commit}


def lineage_tags(run: TrainingRun) -> dict[str, str]:
    """Dataset, code and run lineage of a finished training run."""
    return {
        **dataset_lineage_tags(run.dataset, run.dataset_root),
        **code_lineage_tags(run.config),
        "training.run_name": run.name,
        "training.run_dir": str(run.path),
        FINGERPRINT_TAG: run.fingerprint,
    }


def _timestamp_ms(record: dict[str, Any]) -> int:
    t = record.get("time")
    if not isinstance(t, int | float):
        return int(time.time() * 1000)
    return int(t if t > 1e11 else t * 1000)  # seconds (time.time()) or already milliseconds


def _metric_series(records: list[dict[str, Any]], keys: tuple[str, ...], prefix: str) -> list[Metric]:
    out = []
    for r in records:
        for key in keys:
            value = r.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append(Metric(f"{prefix}{key}", float(value), _timestamp_ms(r), int(r.get("step", 0))))
    return out


def _log_metrics(client: MlflowClient, run_id: str, run: TrainingRun) -> None:
    metrics = _metric_series(run.steps, STEP_METRICS, "train_")
    # Epoch metrics at the global step where they were measured, so they line up with the loss.
    metrics += _metric_series(run.epochs, ("val_loss", "epoch"), "")
    metrics += _metric_series(run.epochs, EPOCH_METRICS, "val_")
    for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
        client.log_batch(run_id, metrics=metrics[i : i + MAX_METRICS_PER_BATCH])


def _figure(value: int | float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def summary_tags(summary: RunSummary) -> dict[str, str]:
    """The run's single numbers as tags: ``best.<metric>`` for the best epoch's validation metrics,
    ``summary.<field>`` for every number of summary.json (exact values: the summary.json artifact)."""
    tags = {f"best.{k}": _figure(v) for k, v in summary.best_metrics.items() if k in ("val_loss", *EPOCH_METRICS)}
    for field in dataclasses.fields(summary):
        value = getattr(summary, field.name)
        if field.name not in NOT_SUMMARY_FIGURES and isinstance(value, int | float) and not isinstance(value, bool):
            tags[f"summary.{field.name}"] = _figure(value)
    return tags


def training_dataset(manifest: DatasetManifest, source: Path) -> MetaDataset:
    """The dataset a run trained on, as an MLflow dataset (metadata only: the shards stay where they are).

    Name is the dataset version, digest its content hash (cut to the length MLflow stores; the full
    hash is the ``dataset.content_hash`` tag), schema the raw feature columns and the label.
    """
    columns = feature_columns(manifest.numeric_features, manifest.categorical_features)
    return MetaDataset(
        get_dataset_source_from_json(json.dumps({"uri": str(source)}), source_type="local"),
        name=manifest.version,
        digest=manifest.content_hash[:MAX_DATASET_DIGEST_SIZE],
        schema=Schema([*columns, ColSpec("long", LABEL_COLUMN)]),
    )


def log_training_dataset(manifest: DatasetManifest, source: Path) -> None:
    """Log ``manifest`` as the active run's training dataset input (``source``: where it is published)."""
    mlflow.log_input(training_dataset(manifest, source), context=DATASET_CONTEXT,
                     tags={CONTENT_HASH_TAG: manifest.content_hash})


def _epoch_ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def _log_plots(run: TrainingRun) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        plots.plot_training_curves(run.steps, run.epochs, out / "training_curves.png")
        if run.validation_scores.is_file():
            scores = pd.read_parquet(run.validation_scores, columns=["score", "label"])
            labels, values = scores["label"].to_numpy(np.int64), scores["score"].to_numpy(np.float64)
            finite = np.isfinite(values)
            if 0 < labels[finite].sum() < finite.sum():
                plots.write_score_plots(labels[finite], values[finite], out)
            else:
                log.warning("validation scores of %s hold one class only: no ROC/PR/calibration plots", run.name)
        else:
            log.warning("%s has no validation_scores.parquet: no ROC/PR/calibration plots", run.path)
        mlflow.log_artifacts(str(out), artifact_path="plots")


def find_registered_version(client: MlflowClient, config: RegistryConfig, run: TrainingRun) -> int | None:
    """The version already registered from this exact run directory, if any."""
    experiment = client.get_experiment_by_name(config.experiment_name)
    if experiment is None:
        return None
    runs = client.search_runs([experiment.experiment_id], f"tags.`{FINGERPRINT_TAG}` = '{run.fingerprint}'")
    for mlflow_run in runs:
        versions = client.search_model_versions(f"name = '{config.model_name}' and run_id = '{mlflow_run.info.run_id}'")
        if versions:
            return max(int(v.version) for v in versions)
    return None


def register_run(run_dir: Path, config: RegistryConfig) -> int:
    """Log ``run_dir`` as an MLflow run, register its model and point ``challenger`` at it.

    Returns the version number. Raises RunDirError for an unfinished/incomplete run and
    TrackingUnavailable when the store cannot be reached; neither leaves a new version behind.
    """
    run = read_training_run(run_dir)
    client = connect(config)
    version = find_registered_version(client, config, run)
    if version is None:
        version = _log_and_register(client, config, run)
    client.set_registered_model_alias(config.model_name, CHALLENGER, str(version))
    return version


def _log_and_register(client: MlflowClient, config: RegistryConfig, run: TrainingRun) -> int:
    experiment_id = ensure_experiment(client, config)
    tags = lineage_tags(run)
    # Created with training's start time (summaries without one: now); resolve_tags adds what
    # mlflow.start_run would (user, source) under ours.
    created = client.create_run(experiment_id, start_time=_epoch_ms(run.summary.started_at),
                                tags=resolve_tags({**tags, **summary_tags(run.summary)}), run_name=run.name)
    run_id = created.info.run_id
    with mlflow.start_run(run_id=run_id):
        params = {k: ("" if v is None else str(v))[:MAX_PARAM_VAL_LENGTH] for k, v in flatten(run.config).items()}
        mlflow.log_params(params)
        _log_metrics(client, run_id, run)
        log_training_dataset(run.dataset, run.dataset_root or run.files.dataset)
        for path in (run.files.config, run.files.dataset, run.files.summary, run.validation_scores):
            if path.is_file():  # validation scores: the monitor's reference distribution of live scores
                mlflow.log_artifact(str(path), artifact_path=RUN_ARTIFACTS)
        _log_plots(run)
        info = log_pyfunc_model(run.model_dir)
    if run.summary.finished_at is not None:  # leaving start_run stamped "now"; the run ended with training
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED), end_time=_epoch_ms(run.summary.finished_at))
    points = read_operating_points(run.model_dir)
    if points is None:
        log.warning("%s ships no %s: the service will serve it with serving.toml's explicit thresholds or "
                    "refuse it (decision.without_operating_points)", run.name, OPERATING_POINTS_FILE)
    return register_version(config.model_name, info.model_uri,
                            {**tags, "source": "training-run", **(points.tags() if points else {})})
