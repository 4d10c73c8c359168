"""A small published dataset with a learnable fraud signal, in exactly the ingest format.

Tests, the GPU check and the benchmarks use it where the real producer (Kafka -> Spark ingest)
would be too slow or absent. It is *not* a second feature definition of the real pipeline: the
columns are generic numeric/categorical features whose fraud signal is known by construction.
Written through :func:`pipeline.datasets.manifest.publish_manifest`, so it carries the same
guarantees (shards complete and hashed before the manifest appears).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import publish_dir
from pipeline.datasets.layout import data_dir, shard_relpath, version_dir, version_relpath
from pipeline.datasets.manifest import (
    DatasetManifest,
    DateWindow,
    ShardInfo,
    content_hash,
    file_sha256,
    publish_manifest,
)

NUMERIC = ("amount_log", "amount_to_card_mean", "card_txn_count_24h", "hour_sin", "hour_cos",
           "distance_km_log", "merchant_risk", "noise")
CATEGORICAL = {"merchant_category": 16, "country": 12, "channel": 4}


@dataclass(frozen=True)
class SyntheticSpec:
    start_date: str = "2026-01-01"
    train_days: int = 6
    validation_days: int = 2
    test_days: int = 2
    rows_per_day: int = 4000
    shards_per_date: int = 2
    row_group_rows: int = 1024  # several row groups per shard exercise the streaming reader
    num_cards: int = 3000
    seed: int = 7


def _day_frame(rng: np.random.Generator, spec: SyntheticSpec, day: dt.date, day_index: int) -> dict:
    n = spec.rows_per_day
    cards = rng.integers(0, spec.num_cards, n)
    compromised = rng.random(spec.num_cards) < 0.01  # cards stolen that day
    stolen = compromised[cards]
    seconds = np.sort(rng.integers(0, 86_400, n))
    hour = seconds / 3600.0
    amount_log = rng.normal(3.5, 1.0, n) + 0.9 * stolen
    ratio = np.exp(amount_log - 3.5) * rng.lognormal(0, 0.3, n)
    velocity = rng.poisson(2 + 6 * stolen)
    distance = rng.exponential(1.0, n) + 2.5 * stolen * rng.random(n)
    mcc = rng.integers(1, CATEGORICAL["merchant_category"], n)
    country = np.where(rng.random(n) < 0.9, 1, rng.integers(2, CATEGORICAL["country"], n))
    channel = rng.integers(1, CATEGORICAL["channel"], n)
    risky_mcc = np.isin(mcc, (3, 7, 11))
    night = (hour < 5).astype(float)
    # Nonlinear signal: interactions (risky merchant x online, abroad x night) matter, not only sums.
    logit = (-6.0 + 2.2 * stolen + 0.6 * np.log1p(ratio) + 0.25 * velocity + 0.5 * distance
             + 1.4 * risky_mcc * (channel == 3) + 1.2 * (country > 1) * night)
    label = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    merchant_risk = 0.3 * risky_mcc + rng.normal(0, 0.1, n)
    amount = amount_log.copy()
    amount[rng.random(n) < 0.01] = np.nan  # missing values happen in real features
    base = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    return {
        "transaction_id": [f"t{day_index:04d}-{i:07d}" for i in range(n)],
        "card_id": [f"c{c:06d}" for c in cards],
        "event_time": pa.array([base + dt.timedelta(seconds=int(s)) for s in seconds], pa.timestamp("us", "UTC")),
        "label": label,
        "amount_log": amount, "amount_to_card_mean": ratio, "card_txn_count_24h": velocity.astype(float),
        "hour_sin": np.sin(2 * np.pi * hour / 24), "hour_cos": np.cos(2 * np.pi * hour / 24),
        "distance_km_log": np.log1p(distance), "merchant_risk": merchant_risk, "noise": rng.normal(0, 1, n),
        "merchant_category": mcc, "country": country, "channel": channel,
    }


def write_synthetic_dataset(root: Path, spec: SyntheticSpec = SyntheticSpec(),
                            dataset: str = "synthetic") -> DatasetManifest:
    """Write shards + manifest under ``root`` (train, validation, test windows in that order)."""
    root = Path(root)
    staging = data_dir(root) / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    rng = np.random.default_rng(spec.seed)
    start = dt.date.fromisoformat(spec.start_date)
    total_days = spec.train_days + spec.validation_days + spec.test_days
    staged: list[tuple[str, ShardInfo]] = []
    for d in range(total_days):
        day = start + dt.timedelta(days=d)
        table = pa.table(_day_frame(rng, spec, day, d))
        bounds = np.linspace(0, table.num_rows, spec.shards_per_date + 1).astype(int)
        for s in range(spec.shards_per_date):
            part = table.slice(bounds[s], bounds[s + 1] - bounds[s])
            rel = shard_relpath(day.isoformat(), s)
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(part, path, row_group_size=spec.row_group_rows)
            frauds = int(np.asarray(part.column("label")).sum())
            staged.append((rel, ShardInfo(rel, day.isoformat(), s, part.num_rows, frauds, file_sha256(path))))
    schema = {"numeric": list(NUMERIC), "categorical": CATEGORICAL, "spec": spec.__dict__}
    digest = content_hash([info for _, info in staged], schema)
    version = f"v-{digest[:12]}"
    publish_dir(staging, version_dir(root, version), keep_existing=True)  # content-addressed: an existing one is this one
    shards = tuple(
        ShardInfo(version_relpath(version, rel), i.date, i.shard, i.rows, i.frauds, i.sha256) for rel, i in staged
    )

    def window(first: int, days: int) -> DateWindow:
        return DateWindow((start + dt.timedelta(days=first)).isoformat(),
                          (start + dt.timedelta(days=first + days - 1)).isoformat())

    manifest = DatasetManifest(
        dataset=dataset, version=version, created_at=dt.datetime.now(dt.UTC).isoformat(),
        schema_version=1, feature_version=1, numeric_features=NUMERIC, categorical_features=dict(CATEGORICAL),
        splits={"train": window(0, spec.train_days),
                "validation": window(spec.train_days, spec.validation_days),
                "test": window(spec.train_days + spec.validation_days, spec.test_days)},
        label_cutoff=(start + dt.timedelta(days=total_days)).isoformat(),
        num_shards_per_date=spec.shards_per_date, shards=shards, kafka_offsets={}, content_hash=digest,
        extra={"generator": "pipeline.training.synthetic"},
    )
    publish_manifest(root, manifest)
    return manifest
