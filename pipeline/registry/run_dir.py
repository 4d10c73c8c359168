"""Read a finished training run directory (the contract in helpers/run_dir_contract.md).

Only what the registry needs: the config, the dataset manifest trained on (lineage), metrics,
the summary and where the model and validation scores are. A run without ``summary.json`` (status
``completed``) did not finish and is refused: registering half a run would put an untested model
one ``promote`` away from production.
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


@dataclass(frozen=True)
class TrainingRun:
    path: Path
    name: str
    config: dict[str, Any]
    dataset: DatasetManifest
    dataset_root: Path | None
    steps: list[dict[str, Any]]
    epochs: list[dict[str, Any]]
    summary: dict[str, Any]
    fingerprint: str  # sha256 of summary.json: same finished run -> same fingerprint

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def validation_scores(self) -> Path:
        return self.path / "validation_scores.parquet"


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise RunDirError(f"{path} is missing: {path.parent} is not a complete training run directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunDirError(f"{path} is not valid JSON ({exc}); re-run training for this run") from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL metrics file; a torn last line (killed writer) is ignored."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def read_training_run(path: Path) -> TrainingRun:
    """Load a finished run directory; raises RunDirError naming what is missing."""
    path = Path(path).resolve()
    if not path.is_dir():
        raise RunDirError(f"run directory {path} does not exist")
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise RunDirError(
            f"{path} has no summary.json: the training run did not finish; register only completed runs"
        )
    summary = _read_json(summary_path)
    if summary.get("status") != "completed":
        raise RunDirError(f"{path}: summary.json status is {summary.get('status')!r}, not 'completed'")
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (path / "model" / name).is_file():
            raise RunDirError(f"{path}/model/{name} is missing: the run wrote no final model")
    try:
        dataset = DatasetManifest.from_json((path / "dataset.json").read_text())
    except FileNotFoundError as exc:
        raise RunDirError(f"{path}/dataset.json is missing: no lineage for this run") from exc
    except (ManifestError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RunDirError(f"{path}/dataset.json is not a dataset manifest ({exc})") from exc
    root_file = path / "dataset_root.txt"
    dataset_root = Path(root_file.read_text().strip()) if root_file.is_file() else None
    return TrainingRun(
        path=path,
        name=str(summary.get("run_name") or path.name),
        config=_read_json(path / "config.json"),
        dataset=dataset,
        dataset_root=dataset_root,
        steps=_read_jsonl(path / "metrics" / "steps.jsonl"),
        epochs=_read_jsonl(path / "metrics" / "epochs.jsonl"),
        summary=summary,
        fingerprint=hashlib.sha256(summary_path.read_bytes()).hexdigest(),
    )
