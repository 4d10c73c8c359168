"""Checks that decide, before any worker starts, whether a training job can run at all.

A bad config, a missing dataset, an empty or fraud-free split, or a batch that does not fit the
train split fails identically on every attempt; under torchrun each attempt would cost a
rendezvous and a restart from ``--max-restarts``, and the last message would be about batch
sizes when the cause is the dataset. :func:`pipeline.training.launch.run_training` runs
:func:`check_startable` in its own process and launches nothing when it fails;
``jobs/train.py`` runs it too (a bare ``torchrun`` has no launcher) and exits with
:data:`EXIT_CANNOT_START` for every error in :data:`CANNOT_START_ERRORS`.

Only manifests and Parquet footers are read, never rows.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.config import ConfigError
from pipeline.datasets.manifest import DatasetManifest, ManifestError, load_manifest
from pipeline.paths import resolve_state_path
from pipeline.training.comm_hooks import CompressionUnsupported
from pipeline.training.config import TrainConfig
from pipeline.training.data import DataConfigError, TrainStream, split_global_batch
from pipeline.training.trainer import RunDirectoryInUse

# jobs/train.py's exit code when retrying cannot help (schedulers: do not retry); 1 is a failed run.
EXIT_CANNOT_START = 2
# Splits the job reads: train to fit, validation for early stopping and calibration.
TRAINING_SPLITS = ("train", "validation")


class DatasetUnusable(ValueError):
    """The published dataset cannot train a model: a split the job reads is empty, or train has no fraud."""


# Failures fixed only by changing the config, the dataset or the run directory.
CANNOT_START_ERRORS = (ConfigError, ManifestError, DatasetUnusable, DataConfigError, CompressionUnsupported,
                       RunDirectoryInUse)


def resolve_dataset_root(config: TrainConfig, override: str | Path | None = None) -> Path:
    """``override`` (``--dataset-root``) or ``data.dataset_root``; relative paths under the state directory."""
    return resolve_state_path(override or config.data.dataset_root)


def check_dataset_usable(manifest: DatasetManifest) -> None:
    """DatasetUnusable naming the split, its dates and counts, and what to do."""
    for split in TRAINING_SPLITS:
        shards = manifest.shards_for(split)
        rows, frauds = sum(s.rows for s in shards), sum(s.frauds for s in shards)
        if rows == 0 or (split == "train" and frauds == 0):
            window = manifest.splits[split]
            raise DatasetUnusable(
                f"dataset {manifest.dataset}@{manifest.version} has {rows} rows and {frauds} frauds in its {split} "
                f"split ({window.start}..{window.end}): training needs rows in train and validation and frauds in "
                f"train; publish a dataset whose windows hold data (`fraudctl ingest` for a later run date) or "
                f"point data.version / --dataset-root at one")


def check_startable(config: TrainConfig, dataset_root: Path, world_size: int) -> DatasetManifest:
    """The dataset ``config`` names under ``dataset_root``, after checking that a job of
    ``world_size`` processes can train on it. Raises one of :data:`CANNOT_START_ERRORS`."""
    manifest = load_manifest(dataset_root, config.data.version or None)
    check_dataset_usable(manifest)
    rows = sum(s.rows for s in manifest.shards_for("train"))
    accumulation = config.optim.accumulation_steps
    try:
        micro_rows = split_global_batch(config.data.global_batch_size, world_size, accumulation)
        TrainStream(dataset_root, manifest, 0, world_size, micro_rows, accumulation, config.data.shuffle_window_rows,
                    config.loop.seed, config.data.negative_sample_rate)
    except DataConfigError as exc:
        raise DataConfigError(f"{exc} (the train split of {manifest.dataset}@{manifest.version} has {rows} rows "
                              f"for {world_size} processes)") from exc
    return manifest
