"""Realistic, fast inputs for the registry tests.

* :func:`write_dataset` publishes a small manifested dataset in the ingest format (Parquet shards per
  date with ID_COLUMNS, float numerics, integer categorical codes and ``label``; train/validation/test
  splits by date) whose label depends on the features, so trained models really differ in quality.
* :func:`train_model` fits a tiny FraudModel with plain torch in well under a second.
* :func:`write_run_dir` writes a finished training run directory through
  :class:`pipeline.training.run_dir.RunDir` (the layout and writers training uses).
"""

from __future__ import annotations

import copy
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from models.fraud_mlp import FraudModel, FraudModelConfig, frame_to_tensors, save_model
from pipeline.datasets.layout import manifest_path, shard_path
from pipeline.datasets.manifest import (
    LABEL_COLUMN,
    DatasetManifest,
    DateWindow,
    ShardInfo,
    content_hash,
    file_sha256,
    publish_manifest,
)
from pipeline.datasets.reader import read_split
from pipeline.decisions.operating_points import (
    DecisionBudget,
    choose_operating_points,
    write_operating_points,
)
from pipeline.metrics import classification_report
from pipeline.training.checkpoint import Checkpointer
from pipeline.training.run_dir import COMPLETED, CompressionSummary, RunDir, RunSummary

NUMERIC = ("amount_log", "amount_rel_30d", "secs_since_prev_log", "merchant_fraud_rate_7d")
# Not alphabetical on purpose: the embedding order must survive save/load and the pyfunc signature.
CATEGORICAL = {"mcc": 12, "channel": 4}
RISKY_MCC = 7


def _day_frame(rng: np.random.Generator, date: str, rows: int) -> pd.DataFrame:
    amount_rel = rng.normal(0.0, 1.0, rows)
    merchant_rate = rng.beta(1.0, 30.0, rows)
    mcc = rng.integers(1, CATEGORICAL["mcc"], rows)
    channel = rng.integers(1, CATEGORICAL["channel"], rows)
    # Fraud risk grows with unusual amounts, risky merchants and one merchant category.
    logit = -3.2 + 1.6 * amount_rel + 25.0 * merchant_rate + 1.8 * (mcc == RISKY_MCC)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    day = pd.Timestamp(date, tz="UTC")
    return pd.DataFrame({
        "transaction_id": [f"tx-{date}-{i:05d}" for i in range(rows)],
        "card_id": [f"card-{c:05d}" for c in rng.integers(0, 20_000, rows)],  # few repeat: most frauds on new cards
        "event_time": day + pd.to_timedelta(np.sort(rng.integers(0, 86_400, rows)), unit="s"),
        "amount_log": rng.normal(3.5, 1.0, rows) + 0.3 * amount_rel,
        "amount_rel_30d": amount_rel,
        "secs_since_prev_log": rng.normal(8.0, 2.0, rows),
        "merchant_fraud_rate_7d": merchant_rate,
        "mcc": mcc.astype(np.int32),
        "channel": channel.astype(np.int32),
        LABEL_COLUMN: label,
    })


def _to_arrow(frame: pd.DataFrame) -> pa.Table:
    # Column by column: pyarrow's from_pandas trips a pandas-3 deprecation on tz-aware columns.
    columns = {c: pa.array(frame[c].to_numpy()) for c in frame.columns if c != "event_time"}
    utc = frame["event_time"].dt.tz_convert(None).to_numpy()
    columns["event_time"] = pa.array(utc, type=pa.timestamp("us", tz="UTC"))
    return pa.table({c: columns[c] for c in frame.columns})


def write_dataset(root: Path, *, start: str = "2024-03-01", days: int = 8, rows_per_day: int = 400,
                  seed: int = 0, test_days: int = 2, dataset: str = "transactions",
                  drop_numeric: str | None = None) -> DatasetManifest:
    """Publish ``days`` dates: validation = the date before the last ``test_days``, test = the last ones.

    ``drop_numeric`` leaves one feature out (a dataset of another feature version).
    """
    numeric = tuple(c for c in NUMERIC if c != drop_numeric)
    rng = np.random.default_rng(seed)
    dates = [(dt.date.fromisoformat(start) + dt.timedelta(days=i)).isoformat() for i in range(days)]
    version = f"{dataset}-{dates[0]}-{dates[-1]}-s{seed}"
    shards = []
    for date in dates:
        rel = shard_path(version, date, 0)
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        frame = _day_frame(rng, date, rows_per_day).drop(columns=[drop_numeric] if drop_numeric else [])
        pq.write_table(_to_arrow(frame), path)
        shards.append(ShardInfo(path=rel, date=date, shard=0, rows=len(frame),
                                frauds=int(frame[LABEL_COLUMN].sum()), sha256=file_sha256(path)))
    n_train = days - test_days - 1
    splits = {
        "train": DateWindow(dates[0], dates[n_train - 1]),
        "validation": DateWindow(dates[n_train], dates[n_train]),
        "test": DateWindow(dates[n_train + 1], dates[-1]),
    }
    schema = {"numeric": list(numeric), "categorical": CATEGORICAL}
    manifest = DatasetManifest(
        dataset=dataset, version=version, created_at=f"{dates[-1]}T23:59:59Z", schema_version=1,
        feature_version=1 if drop_numeric is None else 2, numeric_features=numeric,
        categorical_features=dict(CATEGORICAL), splits=splits,
        label_cutoff=dates[-1], num_shards_per_date=1, shards=tuple(shards),
        kafka_offsets={"transactions": {"0": [0, 1000 + seed], "1": [0, 990]}, "fraud-labels": {"0": [0, 40]}},
        content_hash=content_hash(shards, schema),
    )
    publish_manifest(root, manifest)
    return manifest


def model_config(manifest: DatasetManifest) -> FraudModelConfig:
    return FraudModelConfig(numeric_features=manifest.numeric_features,
                            categorical_features=dict(manifest.categorical_features),
                            embedding_dim=4, hidden_dim=16, num_blocks=1, dropout=0.0)


def train_model(root: Path, manifest: DatasetManifest, *, steps: int = 80, rows: int | None = None,
                seed: int = 0) -> FraudModel:
    """Full-batch Adam on the train split (optionally only its first ``rows`` rows)."""
    torch.manual_seed(seed)
    frame = read_split(root, manifest, "train")
    if rows is not None:
        frame = frame.iloc[:rows]
    model = FraudModel(model_config(manifest))
    numeric, categorical = frame_to_tensors(frame, model.config)
    model.set_normalization(numeric.mean(0), numeric.std(0))
    labels = torch.tensor(frame[LABEL_COLUMN].to_numpy(), dtype=torch.float32)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(numeric, categorical), labels)
        loss.backward()
        optimizer.step()
    return model.eval()


def inverted(model: FraudModel) -> FraudModel:
    """Same model with the logit negated: AUC becomes 1 - AUC (a clearly worse model)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.head[1].weight.neg_()
        out.head[1].bias.neg_()
    return out


def with_temperature(model: FraudModel, temperature: float) -> FraudModel:
    """Same ranking (same AUC/AP), different calibration and score distribution."""
    out = copy.deepcopy(model)
    out.temperature.fill_(temperature)
    return out


def with_nan_output(model: FraudModel) -> FraudModel:
    out = copy.deepcopy(model)
    with torch.no_grad():
        out.head[1].bias.fill_(float("nan"))
    return out


def score(model: FraudModel, frame: pd.DataFrame) -> np.ndarray:
    numeric, categorical = frame_to_tensors(frame, model.config)
    return model.predict_proba(numeric, categorical).numpy().astype(np.float64)


def holdout_report(root: Path, manifest: DatasetManifest, model: FraudModel) -> dict[str, float]:
    """The gate's figures, computed here the plain way: the test split without the rows of cards that
    had a fraud in train or validation (known compromised; these datasets carry no report times)."""
    frame = read_split(root, manifest, "test")
    earlier = pd.concat([read_split(root, manifest, split) for split in ("train", "validation")])
    frame = frame[~frame["card_id"].isin(earlier.loc[earlier[LABEL_COLUMN] == 1, "card_id"])]
    return classification_report(frame[LABEL_COLUMN].to_numpy(), score(model, frame))


def write_run_dir(run_dir: Path, model: FraudModel, root: Path, manifest: DatasetManifest,
                  *, name: str | None = None, steps: int = 20) -> Path:
    """A completed training run directory for ``model`` trained on ``manifest`` (published under ``root``)."""
    run = RunDir(run_dir)
    run.write_inputs({
        "model": {"hidden_dim": model.config.hidden_dim, "num_blocks": model.config.num_blocks,
                  "embedding_dim": model.config.embedding_dim},
        "optimizer": {"lr": 0.01, "warmup_steps": 2, "schedule": "cosine"},
        "compression": {"method": "topk", "density": 0.01},
        "world_size": 2, "backend": "gloo",
    }, manifest_path(root, manifest.version), root)
    run.truncate_metrics_after(0)  # written again: the metrics start over, as a run at step 0
    t0 = 1_717_000_000.0
    for step in range(1, steps + 1):
        run.append_step({"step": step, "epoch": (step - 1) * 2 // steps, "loss": 0.6 / step ** 0.5, "lr": 0.01,
                         "density": 0.01, "bytes_sent": 1200, "bytes_dense": 60000, "samples_per_s": 5000.0,
                         "skipped_steps": 0, "time": t0 + step})
    validation = read_split(root, manifest, "validation")
    val_scores = score(model, validation)
    finite = np.isfinite(val_scores)  # a broken (NaN) model still gets a run directory
    metrics = classification_report(validation[LABEL_COLUMN].to_numpy()[finite], val_scores[finite])
    metrics["card_precision_at_100"] = 0.1
    epochs = [{"epoch": e, "step": (e + 1) * steps // 2, "val_loss": 0.3 - 0.05 * e, **metrics,
               "time": t0 + (e + 1) * steps / 2} for e in range(2)]
    for record in epochs:
        run.append_epoch(record)
    save_model(model, run.model)
    if finite.any():  # as finalisation does: the thresholds of the default budget, on validation
        write_operating_points(run.model, choose_operating_points(
            validation[LABEL_COLUMN].to_numpy(), val_scores, DecisionBudget()))
    validation[["transaction_id", "card_id", "event_time", LABEL_COLUMN]].assign(score=val_scores).to_parquet(
        run.validation_scores)
    run.write_summary(RunSummary(
        status=COMPLETED, run_name=name or run.name, global_step=steps, epochs=2, best_epoch=1,
        best_metrics=epochs[-1], temperature=float(model.temperature), bytes_sent_total=1200 * steps,
        bytes_dense_total=60000 * steps, compression=CompressionSummary("topk", 0.01), world_size=2, wall_s=3.5,
        peak_rss_mb=800.0, stopped_early=False))
    return run_dir


def write_checkpoint(run_dir: Path, model: FraudModel, step: int) -> Path:
    """A training checkpoint of ``model`` in the training job's own format (its Checkpointer), marked best."""
    checkpointer = Checkpointer(RunDir(run_dir).checkpoints, rank=0, world_size=1, keep_last=3, barrier=lambda: None)
    trainer_state = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()}, "step": step}
    return checkpointer.save(step, epoch=1, trainer_state=trainer_state, rank_state={},
                             model_config_json=model.config.to_json(), is_best=True)
