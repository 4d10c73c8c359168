"""A published dataset whose only fraud signal is one amount threshold at one merchant category.

Fraud is exactly ``amount > THRESHOLD and mcc == FRAUD_MCC``. Amounts are whole cents; a quarter of
the payments lie within one unit of the threshold, half of those at ``FRAUD_MCC``, and
``THRESHOLD`` itself occurs at ``FRAUD_MCC`` (genuine: the rule is strict), so a model ranks the
frauds first only if it resolves the threshold to the cent.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.datasets.layout import shard_path
from pipeline.datasets.manifest import (
    DatasetManifest,
    DateWindow,
    ShardInfo,
    content_hash,
    file_sha256,
    publish_manifest,
)

THRESHOLD = 1234.5
FRAUD_MCC = 5
NUMERIC = ("amount", "noise")
CATEGORICAL = {"mcc": 8}
SPLIT_DAYS = {"train": 4, "validation": 1, "test": 1}


def _day_table(rng: np.random.Generator, day: dt.date, rows: int) -> pa.Table:
    near = rng.random(rows) < 0.25
    cents = np.round(np.exp(rng.uniform(0, 8.5, rows)) * 100)
    cents = np.where(near, THRESHOLD * 100 + rng.integers(-100, 101, rows), cents)
    mcc = np.where(near & (rng.random(rows) < 0.5), FRAUD_MCC, rng.integers(1, CATEGORICAL["mcc"], rows))
    decoy = rng.random(rows) < 0.01  # the threshold itself at the fraud category: not fraud
    cents[decoy], mcc[decoy] = THRESHOLD * 100, FRAUD_MCC
    amount = cents / 100
    label = ((amount > THRESHOLD) & (mcc == FRAUD_MCC)).astype(np.int64)
    base = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
    return pa.table({
        "transaction_id": [f"t{day:%Y%m%d}-{i:06d}" for i in range(rows)],
        "card_id": [f"c{c:05d}" for c in rng.integers(0, 500, rows)],
        "event_time": pa.array([base + dt.timedelta(seconds=int(s)) for s in np.sort(rng.integers(0, 86_400, rows))],
                               pa.timestamp("us", "UTC")),
        "label": label,
        "amount": amount,
        "noise": rng.normal(0.0, 1.0, rows),
        "mcc": mcc,
    })


def write_threshold_dataset(root: Path, rows_per_day: int = 1500, seed: int = 3) -> DatasetManifest:
    """Shards (one per day) and manifest under ``root``; train, validation, test windows in order."""
    rng = np.random.default_rng(seed)
    start = dt.date(2026, 1, 1)
    version = f"v-threshold-{seed}-{rows_per_day}"
    shards, splits, first = [], {}, 0
    for split, days in SPLIT_DAYS.items():
        splits[split] = DateWindow((start + dt.timedelta(days=first)).isoformat(),
                                   (start + dt.timedelta(days=first + days - 1)).isoformat())
        first += days
    for d in range(first):
        day = start + dt.timedelta(days=d)
        table = _day_table(rng, day, rows_per_day)
        rel = shard_path(version, day.isoformat(), 0)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, root / rel, row_group_size=500)
        frauds = int(np.asarray(table.column("label")).sum())
        shards.append(ShardInfo(rel, day.isoformat(), 0, table.num_rows, frauds, file_sha256(root / rel)))
    manifest = DatasetManifest(
        dataset="threshold", version=version, created_at=dt.datetime.now(dt.UTC).isoformat(), schema_version=1,
        feature_version=1, numeric_features=NUMERIC, categorical_features=dict(CATEGORICAL), splits=splits,
        label_cutoff=(start + dt.timedelta(days=first)).isoformat(), num_shards_per_date=1, shards=tuple(shards),
        kafka_offsets={}, content_hash=content_hash(shards, {"numeric": list(NUMERIC), "categorical": CATEGORICAL}),
    )
    publish_manifest(root, manifest)
    return manifest
