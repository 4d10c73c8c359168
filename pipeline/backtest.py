"""``fraudctl backtest``: judge the whole pipeline on a history, with the evaluation protocol.

One backtest, from the raw store to the protocol's figures, through the production jobs:

1. **layout** (:func:`pipeline.evaluation.protocol.plan_backtest`): validation days ending on ``train_end``
   ``D``, train days before them, then a gap of ``G`` days, then the test days;
2. **dataset**: the ingest job's backfill builds that layout from the raw store (Spark, the one
   feature kernel, manifested shards) into the backtest's own dataset root, with label maturity
   ``G``: train and validation labels as known at ``D + G``, test labels fully matured (known
   ``G`` days after the last test day). The production dataset and its ``LATEST`` are untouched;
3. **training**: the normal training job under torchrun (conf/<env>/train.toml, the dataset
   version pinned: :func:`pipeline.training.launch.train_pinned`);
4. **evaluation**: the test split as the gate's holdout (:mod:`pipeline.evaluation.holdout`: cards
   already known compromised removed per day) scored by the trained model, the protocol's figures
   (card precision@100, AUC, AP, recall at 1% FPR, ECE) and, when the simulator's truth is given,
   recall per fraud pattern.

Everything lands under one output directory (``dataset/``, ``run/``, ``train.toml``, ``train.log``,
``report.json``). A re-run reuses what is there: the dataset build is content-addressed and a
finished run is not trained again, so an interrupted backtest continues where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline.atomic import write_json_atomic
from pipeline.evaluation.holdout import Holdout, holdout_metrics, load_holdout
from pipeline.evaluation.protocol import (
    PATTERN_COLUMN,
    BacktestDays,
    BacktestLayout,
    pattern_recall,
    plan_backtest,
)
from pipeline.ingest.config import IngestConfig
from pipeline.training.launch import Torchrun, train_pinned
from pipeline.training.run_dir import RunDir

Echo = Callable[[str], None]
REPORT_FILE = "report.json"


@dataclass(frozen=True)
class BacktestSpec:
    """What the user asks for: the last day the model learns from (validation included) and day counts."""

    train_end: date
    days: BacktestDays

    @property
    def test_end(self) -> date:
        return self.train_end + timedelta(days=self.days.gap + self.days.test)

    @property
    def layout(self) -> BacktestLayout:
        return plan_backtest(self.test_end, self.days)

    @property
    def name(self) -> str:
        d = self.days
        return f"{self.train_end.isoformat()}-t{d.train}-v{d.validation}-g{d.gap}-x{d.test}"


@dataclass(frozen=True)
class BacktestData:
    """The backtest's published dataset and its protocol holdout (the test split)."""

    root: Path
    version: str
    holdout: Holdout


def backtest_ingest_config(config: IngestConfig, days: BacktestDays, root: Path) -> IngestConfig:
    """``config`` with its dataset laid out as the backtest asks, published under ``root``."""
    dataset = dataclasses.replace(
        config.dataset, name=f"{config.dataset.name}-backtest", root=str(root), train_days=days.train,
        validation_days=days.validation, gap_days=days.gap, test_days=days.test, label_maturity_days=days.gap)
    return dataclasses.replace(config, dataset=dataset)


def build_backtest_data(config: IngestConfig, spec: BacktestSpec, root: Path, *, spark=None,
                        progress=None) -> BacktestData:
    """Build (or find, when identical) the backtest's dataset from ``config``'s raw store.

    Raises the ingest job's errors (``PlanError`` when the raw store does not reach the test labels'
    maturity, ``DatasetTooSmall`` when a split is below the configured minimum) unchanged: their
    messages say what to change.
    """
    from pipeline.ingest.job import run_backfill

    layout = spec.layout
    report = run_backfill(backtest_ingest_config(config, spec.days, root), None,
                          date.fromisoformat(layout.train.start), date.fromisoformat(layout.test.end),
                          spark=spark, progress=progress)
    version = report.dataset.version
    return BacktestData(root, version, load_holdout(root, "test", version))


def score_frame(run: RunDir, frame: pd.DataFrame) -> np.ndarray:
    """Calibrated fraud probabilities of ``frame``'s rows by the run's exported model."""
    import torch

    from models.fraud_mlp import frame_to_tensors, load_model

    model = load_model(run.model)
    numeric, categorical = frame_to_tensors(frame, model.config)
    with torch.inference_mode():
        return model.predict_proba(numeric, categorical).numpy().astype(np.float64)


def protocol_figures(holdout: Holdout, scores: np.ndarray, truth: pd.DataFrame | None = None) -> dict[str, Any]:
    """The protocol's figures of ``scores`` on ``holdout``; with ``truth`` (``transaction_id``,
    ``pattern``: the simulator's), also recall per fraud pattern in the top 1% of scores."""
    figures: dict[str, Any] = holdout_metrics(holdout, scores)
    if truth is not None:
        tagged = holdout.frame[["transaction_id"]].merge(
            truth[["transaction_id", "pattern"]].rename(columns={"pattern": PATTERN_COLUMN}),
            on="transaction_id", how="left")
        # The truth, not the labels: unreported frauds of a pattern count as that pattern's too.
        recall, frauds = pattern_recall(tagged[PATTERN_COLUMN].to_numpy(dtype=object), scores)
        figures["pattern_recall"], figures["pattern_frauds"] = recall, frauds
    return figures


def run_backtest(env: str | None, config: IngestConfig, spec: BacktestSpec, out: Path, torchrun: Torchrun, *,
                 train_overrides: dict[str, dict[str, Any]] | None = None, truth: pd.DataFrame | None = None,
                 echo: Echo = print) -> dict[str, Any]:
    """Dataset, training, evaluation (module docstring); returns the report also written to
    ``<out>/report.json``."""
    layout = spec.layout
    echo(f"backtest {spec.name}: " + ", ".join(f"{name} {w.start}..{w.end}" for name, w in layout.windows().items()))
    started = time.monotonic()
    data = build_backtest_data(config, spec, out / "dataset")
    echo(f"dataset {data.version} under {data.root}; holdout {len(data.holdout.frame)} rows, "
         f"{int(data.holdout.labels.sum())} frauds ({data.holdout.known_removed} rows of known-compromised cards removed)")
    run = RunDir(out / "run")
    echo(f"training (torchrun, {torchrun.nproc_per_node} process(es)); job output in {out / 'train.log'}")
    summary = train_pinned(run, data.root, data.version, out / "train.toml", torchrun, env=env,
                           overrides=train_overrides, log_file=out / "train.log").summary
    figures = protocol_figures(data.holdout, score_frame(run, data.holdout.frame), truth)
    report = {
        "spec": {"train_end": spec.train_end.isoformat(), **dataclasses.asdict(spec.days)},
        "layout": {name: [w.start, w.end] for name, w in layout.windows().items()},
        "dataset": {"root": str(data.root), "version": data.version},
        "holdout": data.holdout.describe(),
        "run_dir": str(run.path), "train_s": summary.wall_s, "best_epoch": summary.best_epoch,
        "validation": dict(summary.best_metrics),
        "metrics": figures, "wall_s": round(time.monotonic() - started, 2),
    }
    write_json_atomic(out / REPORT_FILE, report)
    return report
