"""The gate's holdout: the most recent window with mature labels that neither model trained on.

That window is the published dataset's ``test`` split (config ``holdout_split``): ingest builds it
from the latest dates whose labels passed the label cutoff, after a gap of label-maturity days, and
training uses only ``train`` (fit) and ``validation`` (early stopping, temperature).

The holdout follows the evaluation protocol (:mod:`pipeline.evaluation.protocol`): rows of cards already known
to be compromised on the row's day (a fraud in the training period, or a fraud report made, plus
the label delay, before that day) are dropped, since catching those again is worth nothing, and the
metrics are the protocol's (card precision@100 per day with detected cards excluded, AUC, AP,
recall at 1% FPR, ECE). The holdout is identified by a fingerprint of the shards it was built from
(holdout and earlier splits) and its window, so the same rows give the same fingerprint across
dataset versions -- the key that makes a re-run of the same gate idempotent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipeline.datasets.manifest import (
    REPORTED_AT_COLUMN,
    DatasetManifest,
    DateWindow,
    ManifestError,
    ShardInfo,
    content_hash,
    load_manifest,
)
from pipeline.datasets.reader import read_shards
from pipeline.evaluation.errors import HoldoutError
from pipeline.evaluation.protocol import evaluate_protocol, known_compromised_rows

TRAINING_SPLITS = ("train", "validation")  # what a model saw: fitting and early stopping/calibration


@dataclass(frozen=True)
class Holdout:
    manifest: DatasetManifest
    root: Path
    split: str
    window: DateWindow
    frame: pd.DataFrame  # the protocol's rows: known-compromised cards' rows removed
    fingerprint: str
    label_delay: timedelta  # a fraud report counts from reported_at + this (the features' delay)
    known_removed: int = 0  # rows dropped as belonging to a card known compromised that day

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
            "n_known_removed": self.known_removed,
        }


def label_delay_of(manifest: DatasetManifest) -> timedelta:
    """The label delay the dataset's features were built with (0 for datasets that predate recording it)."""
    return timedelta(hours=float(manifest.extra.get("label_delay_hours", 0.0)))


def load_holdout(root: Path, split: str = "test", version: str | None = None) -> Holdout:
    """Read split ``split`` of the dataset version (LATEST by default) under ``root``, protocol applied."""
    try:
        manifest = load_manifest(Path(root), version)
        shards = manifest.shards_for(split)
        if not shards:
            raise HoldoutError(f"split {split!r} of {manifest.dataset}@{manifest.version} has no shards")
        return protocol_holdout(Path(root), manifest, split, manifest.splits[split], shards)
    except ManifestError as exc:
        raise HoldoutError(f"no usable holdout under {root}: {exc}") from exc


def protocol_holdout(root: Path, manifest: DatasetManifest, name: str, window: DateWindow,
                     shards: list[ShardInfo]) -> Holdout:
    """The rows of ``shards`` (the dates of ``window``) minus those of cards known compromised on their day,
    judged from every published row before ``window`` (training frauds, gap reports) and the window's own
    reports. Raises ``ManifestError`` on unreadable shards."""
    frame = read_shards(root, shards)
    earlier = [s for s in manifest.shards if s.date < window.start]
    known_cards, prior_reports = _compromise_evidence(root, manifest, earlier)
    delay = label_delay_of(manifest)
    known = known_compromised_rows(frame, label_delay=delay, known_compromised=known_cards,
                                   prior_reports=prior_reports) if len(frame) else np.zeros(0, dtype=bool)
    fingerprint = content_hash(shards + earlier, {"split": name, "start": window.start, "end": window.end,
                                                  "protocol": "known-compromised-removed"})
    return Holdout(manifest, root, name, window, frame[~known].reset_index(drop=True), fingerprint, delay,
                   int(known.sum()))


def _compromise_evidence(root: Path, manifest: DatasetManifest,
                         shards: list[ShardInfo]) -> tuple[set[str], pd.DataFrame | None]:
    """Cards with a fraud in the earlier splits (known before the holdout), and every fraud report of
    those splits' rows (a gap row's fraud reported during the holdout makes its card known from then)."""
    if not shards:
        return set(), None
    columns = ["card_id", manifest.label_column]
    has_reports = REPORTED_AT_COLUMN in pq.read_schema(root / shards[0].path).names
    rows = read_shards(root, shards, columns + ([REPORTED_AT_COLUMN] if has_reports else []))
    training = [manifest.splits[name] for name in TRAINING_SPLITS if name in manifest.splits]
    # read_shards keeps the shards' order and row counts: each row's split follows from its shard.
    trained = np.repeat([any(w.contains(s.date) for w in training) for s in shards], [s.rows for s in shards])
    known_cards = set(rows.loc[trained & (rows[manifest.label_column] == 1).to_numpy(), "card_id"])
    if not has_reports:
        return known_cards, None
    reported = rows[rows[REPORTED_AT_COLUMN].notna()]
    return known_cards, reported[["card_id", REPORTED_AT_COLUMN]].rename(columns={REPORTED_AT_COLUMN: "reported_at"})


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


def holdout_metrics(holdout: Holdout, scores: np.ndarray) -> dict[str, float]:
    """The protocol's figures on the rows with finite scores, plus ``nan_share`` of the rest.

    ``n`` / ``n_fraud`` count every holdout row (the NaN guardrail judges the unscored ones);
    ``n_known_removed`` the rows the holdout dropped before (the protocol finds none left to drop).
    """
    labels = holdout.labels
    finite = np.isfinite(scores)
    scored = holdout.frame.assign(score=scores, label=labels)[finite]
    report = evaluate_protocol(scored, label_delay=holdout.label_delay).to_dict()
    metrics = {key: value for key, value in report.items() if isinstance(value, int | float)}
    metrics["n"], metrics["n_fraud"] = int(len(labels)), int(labels.sum())
    metrics["n_known_removed"] = holdout.known_removed
    metrics["nan_share"] = float(1.0 - finite.mean()) if len(scores) else 0.0
    return metrics
