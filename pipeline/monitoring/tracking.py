"""The monitored day's figures on each version's MLflow run, with the date as the step.

Step = days since 1970-01-01 of the monitored date, so the run's charts read as a daily series
beside its training metrics. Keys are ``monitor.<figure>`` (``monitor.feature_psi.<feature>``).
Idempotent: a value already logged at that step is not logged again, so a re-run over the same
inputs adds nothing; a re-run whose inputs changed (late score events) adds its values at the same
step, the latest being what MLflow shows. Undefined figures (NaN) are not logged. The day's
``report.json`` and plot are logged as artifacts under ``monitoring/<date>/`` (replaced on re-run).
"""

from __future__ import annotations

import math
import time
from datetime import date
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Metric

from pipeline.monitoring.report import VersionReport

PREFIX = "monitor."


def date_step(day: date) -> int:
    return (day - date(1970, 1, 1)).days


def version_metrics(v: VersionReport) -> dict[str, float]:
    f, at = v.figures, v.figures.at_operating_points
    metrics = {"rows": at.rows, "frauds": at.frauds, "auc_roc": f.auc_roc, "average_precision": f.average_precision,
               "recall": at.recall, "precision": at.precision, "block_precision": at.block_precision,
               "review_rate": at.review_rate, "block_rate": at.block_rate, "score_psi": f.score_psi,
               "degraded": float(v.state == "degraded"), "days_below_in_a_row": v.days_below_in_a_row,
               "missed_fraud_cards": v.day.missed_fraud_cards, "missed_fraud_ratio": v.day.missed_fraud_ratio}
    finite_psi = [x for x in f.feature_psi.values() if math.isfinite(x)]
    if finite_psi:
        metrics["feature_psi_max"] = max(finite_psi)
    metrics |= {f"feature_psi.{name}": psi for name, psi in f.feature_psi.items()}
    return {f"{PREFIX}{k}": float(x) for k, x in metrics.items() if x is not None and math.isfinite(float(x))}


def log_day(client: MlflowClient, run_id: str, day: date, metrics: dict[str, float],
            artifacts: list[Path]) -> int:
    """Log ``metrics`` at the date's step (skipping values already there) and the artifacts; the count logged."""
    step = date_step(day)
    now = int(time.time() * 1000)
    new = [Metric(key, value, now, step) for key, value in sorted(metrics.items())
           if not any(m.step == step and m.value == value for m in client.get_metric_history(run_id, key))]
    if new:
        client.log_batch(run_id, metrics=new)
    for path in artifacts:
        client.log_artifact(run_id, str(path), artifact_path=f"monitoring/{day.isoformat()}")
    return len(new)
