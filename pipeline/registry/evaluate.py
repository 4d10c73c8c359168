"""``fraudctl evaluate``: score any model URI on any published dataset window.

The window is evaluated by the protocol (:mod:`pipeline.evaluation.protocol`), as the gate evaluates its holdout:
rows of cards already known compromised on their day are left out (``n_known_removed``), and the
report holds auc_roc, average_precision, recall_at_1pct_fpr, card_precision_at_100 (per day, detected
cards excluded), ece, n, n_fraud. Optionally writes the evaluated rows' scores (transaction_id,
card_id, event_time, score, label, reported_at) as Parquet.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from pipeline.atomic import atomic_path
from pipeline.datasets.manifest import REPORTED_AT_COLUMN, DateWindow, ManifestError, load_manifest
from pipeline.evaluation.holdout import holdout_metrics, protocol_holdout
from pipeline.registry.errors import DatasetError
from pipeline.registry.scoring import load_scorer, score_rows

REPORT_KEYS = ("auc_roc", "average_precision", "recall_at_1pct_fpr", "card_precision_at_100", "ece", "n",
               "n_fraud")
# models:/<name>@<alias> or models:/<name>/<version>
REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))$")


def dataset_root_of(client: MlflowClient, model_uri: str) -> Path | None:
    """The dataset root a registered version was trained from (its lineage tag), when the URI names one."""
    match = REGISTRY_URI.match(model_uri)
    if not match:
        return None
    try:
        if match["alias"]:
            version = client.get_model_version_by_alias(match["name"], match["alias"])
        else:
            version = client.get_model_version(match["name"], match["version"])
    except MlflowException:
        return None
    root = version.tags.get("dataset.root")
    return Path(root) if root else None


def _write_parquet_atomic(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False)


def evaluate_window(model_uri: str, dataset_root: Path, start: str, end: str, scores_out: Path | None = None,
                    dataset_version: str | None = None) -> dict[str, Any]:
    """Metrics of ``model_uri`` on dates ``[start, end]`` of the dataset (LATEST version by default)."""
    try:
        manifest = load_manifest(Path(dataset_root), dataset_version)
        window = DateWindow(start, end)
        holdout = protocol_holdout(Path(dataset_root), manifest, "window", window,
                                   [s for s in manifest.shards if window.contains(s.date)])
    except ManifestError as exc:
        raise DatasetError(str(exc)) from exc
    if holdout.frame.empty:
        raise DatasetError(f"{manifest.dataset}@{manifest.version} has no rows in {start}..{end} to evaluate")
    scores = score_rows(load_scorer(model_uri), model_uri, holdout.frame)
    metrics = holdout_metrics(holdout, scores)
    report: dict[str, Any] = {key: metrics[key] for key in REPORT_KEYS}
    report.update(nan_share=metrics["nan_share"], n_known_removed=holdout.known_removed, model_uri=model_uri,
                  dataset=f"{manifest.dataset}@{manifest.version}", start=start, end=end)
    if scores_out is not None:
        columns = [c for c in ("transaction_id", "card_id", "event_time", REPORTED_AT_COLUMN) if c in holdout.frame]
        _write_parquet_atomic(holdout.frame[columns].assign(score=scores, label=holdout.labels), Path(scores_out))
    return report
