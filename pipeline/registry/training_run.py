"""Read a finished training run directory for registration (layout and summary:
:mod:`pipeline.training.run_dir`, the one definition both sides import).

Only what the registry needs: the config, the dataset manifest trained on (lineage), metrics,
the summary and where the model and validation scores are. A run without ``summary.json`` (status
``completed``) did not finish and is refused: registering half a run would put an untested model
one ``promote`` away from production. Every failure is a RunDirError naming the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.fraud_mlp import CONFIG_FILE, WEIGHTS_FILE
from pipeline.datasets.manifest import DatasetManifest, ManifestError
from pipeline.registry.errors import RunDirError
from pipeline.training.run_dir import RunDir, RunSummary, RunSummaryError


@dataclass(frozen=True)
class TrainingRun:
    files: RunDir
    config: dict[str, Any]
    dataset: DatasetManifest
    dataset_root: Path | None
    steps: list[dict[str, Any]]
    epochs: list[dict[str, Any]]
    summary: RunSummary
    fingerprint: str  # sha256 of summary.json: same finished run -> same fingerprint

    @property
    def path(self) -> Path:
        return self.files.path

    @property
    def name(self) -> str:
        return self.summary.run_name or self.files.name

    @property
    def model_dir(self) -> Path:
        return self.files.model

    @property
    def validation_scores(self) -> Path:
        return self.files.validation_scores


def read_training_run(path: Path) -> TrainingRun:
    """Load a finished run directory; raises RunDirError naming what is missing or malformed."""
    files = RunDir(Path(path).resolve())
    if not files.path.is_dir():
        raise RunDirError(f"run directory {files.path} does not exist")
    try:
        summary = files.read_summary()
    except RunSummaryError as exc:
        raise RunDirError(f"{exc}; re-run training for this run") from exc
    if summary is None:
        raise RunDirError(
            f"{files.path} has no {files.summary.name}: the training run did not finish; register only completed runs"
        )
    if not summary.completed:
        raise RunDirError(f"{files.summary}: status is {summary.status!r}, not 'completed'")
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (files.model / name).is_file():
            raise RunDirError(f"{files.model / name} is missing: the run wrote no final model")
    try:
        dataset = files.read_dataset()
    except FileNotFoundError as exc:
        raise RunDirError(f"{files.dataset} is missing: no lineage for this run") from exc
    except (ManifestError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RunDirError(f"{files.dataset} is not a dataset manifest ({exc})") from exc
    try:
        config = files.read_config()
        steps, epochs = files.read_steps(), files.read_epochs()
    except FileNotFoundError as exc:
        raise RunDirError(f"{exc.filename} is missing: {files.path} is not a complete training run directory") from exc
    except ValueError as exc:  # JSONDecodeError included
        raise RunDirError(f"{files.path}: {exc}; re-run training for this run") from exc
    return TrainingRun(
        files=files,
        config=config,
        dataset=dataset,
        dataset_root=files.read_dataset_root(),
        steps=steps,
        epochs=epochs,
        summary=summary,
        fingerprint=hashlib.sha256(files.summary.read_bytes()).hexdigest(),
    )
