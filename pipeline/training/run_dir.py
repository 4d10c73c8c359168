"""The files of a training run directory (see helpers' run_dir_contract: the registry reads them).

Rank 0 alone writes here; each function names one file of the contract.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from pipeline.datasets.manifest import DatasetManifest

CONFIG_FILE = "config.json"
DATASET_FILE = "dataset.json"
DATASET_ROOT_FILE = "dataset_root.txt"
STEPS_FILE = "metrics/steps.jsonl"
EPOCHS_FILE = "metrics/epochs.jsonl"
CHECKPOINTS = "checkpoints"
MODEL_DIR = "model"
SCORES_FILE = "validation_scores.parquet"
SUMMARY_FILE = "summary.json"


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, allow_nan=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_run_inputs(run_dir: Path, config: dict[str, Any], manifest: DatasetManifest, dataset_root: Path) -> None:
    """config.json, dataset.json (the manifest file trained on, byte for byte) and dataset_root.txt."""
    write_json_atomic(run_dir / CONFIG_FILE, config)
    shutil.copyfile(Path(dataset_root) / "manifests" / f"{manifest.version}.json", run_dir / DATASET_FILE)
    (run_dir / DATASET_ROOT_FILE).write_text(str(Path(dataset_root).resolve()) + "\n")


def append_jsonl(run_dir: Path, name: str, record: dict[str, Any]) -> None:
    path = run_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")


def truncate_after_step(run_dir: Path, name: str, step: int) -> None:
    """Drop records logged after ``step``: a resumed run replays those steps and logs them again."""
    path = run_dir / name
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)


def read_jsonl(run_dir: Path, name: str) -> list[dict[str, Any]]:
    path = run_dir / name
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None
