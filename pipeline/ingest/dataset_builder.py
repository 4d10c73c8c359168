"""Raw store -> features -> labels -> shards -> published manifest, for one :class:`DatasetPlan`.

Features come from the feature table (:mod:`pipeline.datasets.feature_table`): the plan's dates
are brought up to date first (:func:`~pipeline.ingest.feature_update.update_feature_table`: only
new dates and dates whose inputs changed are computed, by the ``[features] engine``), then read
back and joined with the labels as of the plan's cutoffs. The shards are those of a full Spark rebuild
(:func:`spark_window_features`), byte for byte, so the content hash is the same either way.

Publication order (readers trust only manifests):
0. a split whose dates hold fewer raw transactions than its ``min_rows`` refuses the build at once
   (:func:`~pipeline.ingest.dataset_plan.check_raw_rows`, from Parquet footers);
1. shards go to ``<root>/data/.build-<run_id>/`` (a killed build leaves only this, deleted later);
   if a split holds fewer rows or frauds than configured, the build directory is removed and
   :class:`~pipeline.ingest.dataset_plan.DatasetTooSmall` raised: no version, manifest or
   ``LATEST`` change;
2. the content hash over shard hashes and schema names the version; the directory is renamed to
   ``<root>/data/<version>/`` (if that version already exists, its files are verified and kept:
   rerunning a build is a no-op that reproduces the same hash);
3. :func:`pipeline.datasets.manifest.publish_manifest` writes the manifest and ``LATEST`` last.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.atomic import publish_dir
from pipeline.contract import SCHEMA_VERSION, Kind
from pipeline.datasets.feature_table import FeatureTable
from pipeline.datasets.layout import data_dir, manifest_path, version_dir, version_relpath
from pipeline.datasets.manifest import (
    LABEL_COLUMN,
    DatasetManifest,
    ShardInfo,
    content_hash,
    file_sha256,
    load_manifest,
    publish_manifest,
)
from pipeline.features import definitions as fd
from pipeline.features.params import FeatureParams
from pipeline.features.transforms import build_features, first_fraud_reports, labels_as_of
from pipeline.ingest.config import DatasetConfig, FeaturesConfig
from pipeline.ingest.dataset_plan import SPLITS, DatasetPlan, check_raw_rows, check_split_sizes, split_counts
from pipeline.ingest.feature_update import FeatureUpdate, feature_table_root, plan_dates, update_feature_table
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_store import read_raw_table
from pipeline.ingest.shards import SHARD_SCHEMA, write_empty_shards, write_shards


@dataclass(frozen=True)
class DatasetSummary:
    """What a build published (or found already published)."""

    name: str
    root: str
    version: str
    manifest_path: str
    content_hash: str
    label_cutoff: str
    rows: int
    frauds: int
    splits: dict[str, dict]  # split -> {start, end, shards, rows, frauds}
    reused: bool  # the same version was already published: nothing rewritten
    features: dict = field(default_factory=dict)  # the feature table update: dates computed, dates reused


def spark_window_features(spark: SparkSession, store: RawStore, plan: DatasetPlan, params: FeatureParams) -> DataFrame:
    """Feature rows of the plan's dates computed by one Spark job over the window and its lookback
    (lazy): the full rebuild the feature table is tested equal to, and the benchmark's peer."""
    tx = read_raw_table(spark, store, Kind.TRANSACTION, plan.feature_history_start(), plan.last_date)
    history = read_raw_table(spark, store, Kind.TRANSACTION, plan.label_match_start(params), plan.last_date)
    labels = read_raw_table(spark, store, Kind.LABEL, plan.label_history_start(params), plan.label_cutoff)
    features = build_features(tx, labels, params, history=history)
    return features.filter(F.col("event_date").between(F.lit(plan.first_date), F.lit(plan.last_date)))


def table_window_features(spark: SparkSession, table: FeatureTable, plan: DatasetPlan) -> DataFrame:
    """Feature rows of the plan's dates read from the feature table's partitions (each must exist:
    :func:`~pipeline.ingest.feature_update.update_feature_table` first)."""
    return spark.read.parquet(*(str(table.partition_file(day)) for day in plan_dates(plan)))


def dataset_rows(spark: SparkSession, store: RawStore, plan: DatasetPlan, params: FeatureParams,
                 in_window: DataFrame) -> DataFrame:
    """The window's feature rows (``in_window``) with their label and first fraud report (lazy)."""
    labels = read_raw_table(spark, store, Kind.LABEL, plan.label_history_start(params), plan.label_cutoff)
    # Train and validation rows take labels as known at the train cutoff (the gap's end), the rest
    # (gap and test) as known at the label cutoff; reported_at is the first fraud report by then.
    known_in_training = labels_as_of(labels, plan.label_cutoff_time_of("train")).withColumnRenamed("label", "_train")
    known_at_cutoff = labels_as_of(labels, plan.label_cutoff_time_of("test")).withColumnRenamed("label", "_final")
    trained_on = F.col("event_date") <= F.lit(date.fromisoformat(plan.splits["validation"].end))
    return (in_window.join(known_in_training, "transaction_id", "left")
            .join(known_at_cutoff, "transaction_id", "left")
            .join(first_fraud_reports(labels, plan.label_cutoff_time), "transaction_id", "left")
            .withColumn(LABEL_COLUMN, F.coalesce(F.when(trained_on, F.col("_train")).otherwise(F.col("_final")),
                                                 F.lit(0)))
            .drop("_train", "_final"))


def schema_description(plan: DatasetPlan, config: DatasetConfig, params: FeatureParams) -> dict:
    """Everything besides the shard bytes that defines the dataset (hashed into the version)."""
    return {
        "contract_schema_version": SCHEMA_VERSION,
        **fd.schema_fingerprint(),
        "shard_schema": [f"{f.name}:{f.type}" for f in SHARD_SCHEMA],
        "splits": {k: [w.start, w.end] for k, w in plan.splits.items()},
        "label_cutoff": plan.label_cutoff.isoformat(),
        "train_label_cutoff": plan.train_label_cutoff.isoformat(),
        "label_maturity_days": config.label_maturity_days,
        "num_shards_per_date": config.num_shards_per_date,
        # The label rule the merchant features used; the evaluation protocol applies the same delay.
        "label_delay_hours": params.label_delay_hours,
        "label_match_days": params.label_match_days,
    }


def _place_version(build_dir: Path, final_dir: Path, shards: list[ShardInfo]) -> bool:
    """Move the build into place; True when an identical version was already there (a damaged
    earlier attempt is replaced: nothing published references it intact)."""
    intact = final_dir.is_dir() and all(
        (final_dir / s.path).is_file() and file_sha256(final_dir / s.path) == s.sha256 for s in shards)
    return publish_dir(build_dir, final_dir, keep_existing=intact)


def build_dataset(spark: SparkSession, store: RawStore, plan: DatasetPlan, config: DatasetConfig,
                  params: FeaturesConfig, run_id: str) -> DatasetSummary:
    """Build, write and publish the dataset of ``plan``; idempotent for unchanged raw data. The
    feature table's stale dates are computed by ``params.engine`` (on ``spark``'s executors, or in
    this process).

    Raises :class:`~pipeline.ingest.dataset_plan.DatasetTooSmall` (nothing published) when a split
    is below ``config.min_rows`` / ``config.min_frauds``.
    """
    root = config.dataset_root()
    for stale in data_dir(root).glob(".build-*"):  # killed builds (callers hold the ingest lock)
        shutil.rmtree(stale, ignore_errors=True)
    build_dir = data_dir(root) / f".build-{run_id}"
    until = data_until(store)  # the store is locked: the same before and after the build
    check_raw_rows(plan, store.committed_rows_by_date(Kind.TRANSACTION, plan.first_date, plan.last_date), config, until)
    table = FeatureTable(feature_table_root(config.feature_table, store))
    update = update_feature_table(store, table, plan, params, config.feature_block_days, engine=params.engine,
                                  spark=spark, hot_key_rows=params.hot_key_rows,
                                  rows_per_task=params.rows_per_task)
    rows = dataset_rows(spark, store, plan, params, table_window_features(spark, table, plan))
    written = write_shards(rows, build_dir, config.num_shards_per_date)
    try:
        check_split_sizes(plan, split_counts(plan.splits, written), config, until)
    except Exception:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    days = [d.isoformat() for d in plan_dates(plan)]
    shards = written + write_empty_shards(build_dir, days, config.num_shards_per_date, written)
    schema = schema_description(plan, config, params)
    digest = content_hash(shards, schema)
    version = f"{plan.label_cutoff.isoformat()}-{digest[:12]}"
    reused = _place_version(build_dir, version_dir(root, version), shards)
    shards = sorted((ShardInfo(version_relpath(version, s.path), s.date, s.shard, s.rows, s.frauds, s.sha256)
                     for s in shards), key=lambda s: (s.date, s.shard))
    if reused and manifest_path(root, version).is_file():
        manifest = load_manifest(root, version)  # keep the first publication (its created_at, offsets)
    else:
        manifest = _manifest(config, plan, version, digest, shards, store, schema)
    return _summary(config, root, manifest, publish_manifest(root, manifest), reused, update)


def _manifest(config: DatasetConfig, plan: DatasetPlan, version: str, digest: str, shards: list[ShardInfo],
              store: RawStore, schema: dict) -> DatasetManifest:
    return DatasetManifest(
        dataset=config.name, version=version,
        created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        schema_version=SCHEMA_VERSION, feature_version=fd.FEATURE_VERSION,
        numeric_features=fd.NUMERIC_FEATURES, categorical_features=dict(fd.CATEGORICAL_FEATURES),
        splits=dict(plan.splits), label_cutoff=plan.label_cutoff.isoformat(),
        num_shards_per_date=config.num_shards_per_date, shards=tuple(shards),
        kafka_offsets=store.committed().consumed_ranges(), content_hash=digest,
        extra={"label_maturity_days": config.label_maturity_days, "train_label_cutoff": plan.train_label_cutoff.isoformat(),
               "label_delay_hours": schema["label_delay_hours"], "raw_store": str(store.root), "hashed_schema": schema},
    )


def _summary(config: DatasetConfig, root: Path, manifest: DatasetManifest, path: Path, reused: bool,
             update: FeatureUpdate) -> DatasetSummary:
    counts = split_counts(manifest.splits, manifest.shards)
    splits = {name: {"start": manifest.splits[name].start, "end": manifest.splits[name].end,
                     "shards": len(manifest.shards_for(name)), "rows": counts[name].rows,
                     "frauds": counts[name].frauds}
              for name in SPLITS}
    return DatasetSummary(
        name=config.name, root=str(root), version=manifest.version, manifest_path=str(path),
        content_hash=manifest.content_hash, label_cutoff=manifest.label_cutoff,
        rows=sum(s.rows for s in manifest.shards), frauds=sum(s.frauds for s in manifest.shards),
        splits=splits, reused=reused, features=update.to_dict())


def data_until(store: RawStore) -> date | None:
    """Latest event date the raw store holds (bounds backfill label cutoffs)."""
    return store.latest_date(Kind.TRANSACTION)
