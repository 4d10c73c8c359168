"""The gate's holdout: the most recent window with mature labels that neither model trained on.

That window is the published dataset's ``test`` split (config ``holdout_split``): ingest builds it
from the latest dates whose labels passed the label cutoff, and training uses only ``train`` (fit)
and ``validation`` (early stopping, temperature). The holdout is identified by a fingerprint of its
shards' bytes and window, so the same rows give the same fingerprint across dataset versions --
the key that makes a re-run of the same gate idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.datasets.manifest import DatasetManifest, DateWindow, ManifestError, content_hash, load_manifest
from pipeline.datasets.reader import read_shards
from pipeline.metrics import classification_report
from pipeline.registry.errors import HoldoutError

TRAINING_SPLITS = ("train", "validation")  # what a model saw: fitting and early stopping/calibration


@dataclass(frozen=True)
class Holdout:
    manifest: DatasetManifest
    root: Path
    split: str
    window: DateWindow
    frame: pd.DataFrame
    fingerprint: str

    @property
    def labels(self) -> np.ndarray:
        return self.frame[self.manifest.label_column].to_numpy(dtype=np.int64)

    @property
    def card_ids(self) -> np.ndarray | None:
        """Card of each row: the unit the gate's intervals resample (None when the rows carry none)."""
        return self.frame["card_id"].to_numpy() if "card_id" in self.frame.columns else None

    def describe(self) -> dict[str, object]:
        return {
            "dataset": self.manifest.dataset, "version": self.manifest.version, "root": str(self.root),
            "split": self.split, "start": self.window.start, "end": self.window.end,
            "fingerprint": self.fingerprint, "n": int(len(self.frame)), "n_fraud": int(self.labels.sum()),
        }


def load_holdout(root: Path, split: str = "test", version: str | None = None) -> Holdout:
    """Read split ``split`` of the dataset version (LATEST by default) under ``root``."""
    try:
        manifest = load_manifest(Path(root), version)
        shards = manifest.shards_for(split)
        if not shards:
            raise HoldoutError(f"split {split!r} of {manifest.dataset}@{manifest.version} has no shards")
        frame = read_shards(Path(root), shards)
    except ManifestError as exc:
        raise HoldoutError(f"no usable holdout under {root}: {exc}") from exc
    window = manifest.splits[split]
    fingerprint = content_hash(shards, {"split": split, "start": window.start, "end": window.end})
    return Holdout(manifest, Path(root), split, window, frame, fingerprint)


def _overlaps(a: DateWindow, b: DateWindow) -> bool:
    return a.start <= b.end and b.start <= a.end


def training_overlap(holdout: Holdout, splits_tag: str | None) -> list[str]:
    """Training splits (from a version's ``dataset.splits`` tag) that overlap the holdout window."""
    if not splits_tag:
        return []
    splits: Mapping[str, list[str]] = json.loads(splits_tag)
    return [
        f"{name} {start}..{end}" for name, (start, end) in splits.items()
        if name in TRAINING_SPLITS and _overlaps(holdout.window, DateWindow(start, end))
    ]


def event_days(frame: pd.DataFrame) -> np.ndarray:
    """YYYY-MM-DD of each row's event time (UTC), for card precision per day."""
    return pd.to_datetime(frame["event_time"], utc=True).dt.strftime("%Y-%m-%d").to_numpy()


def holdout_metrics(frame: pd.DataFrame, labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """The standard report on the rows with finite scores, plus ``nan_share`` of the rest."""
    finite = np.isfinite(scores)
    report = classification_report(
        labels[finite], scores[finite], frame["card_id"].to_numpy()[finite], event_days(frame)[finite]
    )
    # Size of the evidence = every row scored, NaN or not (the NaN guardrail judges those).
    report["n"], report["n_fraud"] = int(len(labels)), int(labels.sum())
    report["nan_share"] = float(1.0 - finite.mean()) if len(scores) else 0.0
    return report
