"""Typed configuration of the ingest job (``conf/<env>/ingest.toml``), one slice per component.

Each component receives only its slice: the session builder gets :class:`SparkConfig`, the Kafka
source :class:`SourceConfig`, the raw store :class:`RawStoreConfig`, the feature transforms
:class:`FeaturesConfig` (the feature knobs and the feature table's engine), the dataset builder :class:`DatasetConfig`,
the run log :class:`LogConfig`.
Connection settings (Spark master) may be overridden by ``$SPARK_MASTER`` and by ``--master``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pipeline.config import ConfigError, env_override, load_section
from pipeline.features.params import FeatureParams
from pipeline.ingest.id_index import BUCKETS
from pipeline.paths import resolve_state_path, state_dir


@dataclass(frozen=True)
class SparkConfig:
    """How the driver builds its SparkSession (see :mod:`pipeline.ingest.session`)."""

    master: str = env_override("SPARK_MASTER", "local[2]")
    app_name: str = "fraud-ingest"
    shuffle_partitions: int = 4  # tiny data in dev: few partitions keep task overhead low
    driver_memory: str = "2g"  # only applies when this process starts the JVM (not under spark-submit)
    loopback_only: bool = True  # bind the driver to 127.0.0.1 (embedded/dev); false on a real cluster
    ui_enabled: bool = False  # the UI would listen on all interfaces; enable on a cluster
    log_level: str = "WARN"  # Spark's own lines at or above this reach the run log (never the terminal)
    conf: dict[str, str] = field(default_factory=dict)  # extra spark.* settings passed through verbatim


@dataclass(frozen=True)
class SourceConfig:
    """How Kafka records are read into Spark (see :mod:`pipeline.ingest.kafka_source`)."""

    # "python": this project's PySpark data source (confluent-kafka on the executors, no jar needed);
    # "kafka": Spark's built-in source, only where the spark-sql-kafka jar is on the classpath.
    format: Literal["python", "kafka"] = "python"
    max_records_per_split: int = 250_000  # a bigger partition range is split into several Spark tasks
    fetch_batch: int = 5_000  # messages per consume() call and per Arrow batch
    stall_timeout_s: float = 30.0  # a read task fails if its partition yields nothing for this long


IndexLookup = Literal["driver", "spark"]  # the loader refuses other values (pipeline.config)


@dataclass(frozen=True)
class RawStoreConfig:
    """Where the raw store lives and which records ingest refuses by their timing."""

    path: str = "raw"  # relative paths are under the state directory
    # An event this far behind its partition's watermark (latest accepted event time) is LATE_EVENT ...
    max_lateness_days: float = 7.0
    # ... and one stamped more than this after its Kafka timestamp is FUTURE_EVENT_TIME (clock skew).
    max_clock_skew_s: float = 300.0
    # A resent record identical to its first copy is counted as a duplicate and, when this is true,
    # also kept in the quarantine (its bytes, and where the first copy is). Conflicting copies
    # (same id, different content) are always quarantined.
    quarantine_duplicates: bool = True
    # Where a run's records are looked up in the identity index, shard by shard (pipeline.ingest.store_copies):
    # "driver" (one bucket after another in the ingest process: no Spark job, faster on small nights)
    # or "spark" (index_lookup_tasks tasks on the executors, each mapping only its buckets' shards).
    index_lookup: IndexLookup = "driver"
    index_lookup_tasks: int = 16

    def root(self) -> Path:
        return resolve_state_path(self.path)


FeatureEngine = Literal["local", "spark"]
FEATURE_ENGINES: tuple[str, ...] = typing.get_args(FeatureEngine)


@dataclass(frozen=True)
class FeaturesConfig(FeatureParams):
    """``[features]``: the label knobs every feature path shares (:class:`FeatureParams`), and where
    the feature table computes its stale dates (:mod:`pipeline.ingest.feature_update`)."""

    # "local": the numpy kernel in this process, a block of dates plus their 30-day lookback in
    # memory (fastest while that fits: no job to schedule, no shuffle). "spark": the same kernel in
    # Spark tasks that also write the partitions; the driver holds only metadata (file lists,
    # fingerprints, the plan's fraud reports), so a portfolio outgrows executors, not the driver.
    engine: FeatureEngine = "local"
    # spark engine: a card or merchant with more payments than this among the dates computed is cut
    # into time chunks of about this many (each with its 30-day lookback as slim context), so no
    # task holds one key's whole history of full rows (pipeline.features.spark_kernel).
    hot_key_rows: int = 1_000_000
    # spark engine: shuffle partitions enough that each holds at most this many of the payments a night
    # reads (its dates and their lookback), never fewer than spark.sql.shuffle.partitions; a task sorts
    # and holds its partition, so this keeps executor memory flat as the portfolio grows.
    rows_per_task: int = 1_000_000


@dataclass(frozen=True)
class SplitMinimums:
    """One least count per split (``min_rows = { train = 1000, validation = 200, test = 200 }``)."""

    train: int
    validation: int
    test: int

    def of(self, split: str) -> int:
        return getattr(self, split)


@dataclass(frozen=True)
class DatasetConfig:
    """The training dataset a run publishes (see :mod:`pipeline.ingest.dataset_builder`)."""

    name: str = "fraud-dev"
    root: str = ""  # "" -> <state>/datasets/<name>
    num_shards_per_date: int = 8  # 1, 2, 4 or 8 ranks each read whole shards
    label_maturity_days: int = 7  # an unreported transaction counts as genuine this long after it happened
    train_days: int = 14
    validation_days: int = 3
    test_days: int = 3
    # Days between validation and test that no split uses (the evaluation protocol's gap G): train and
    # validation labels are taken as known at the gap's end, test labels at the label cutoff, so the
    # holdout measures a model trained before the test days began, as production will use it.
    gap_days: int = 0
    # A build with a split below these is refused before anything is published (DatasetTooSmall).
    # The defaults are the floor that is never right to cross: no empty split, and a train split with
    # at least one fraud to learn from; environments set real floors (conf/prod/ingest.toml).
    min_rows: SplitMinimums = field(default_factory=lambda: SplitMinimums(train=1, validation=1, test=1))
    min_frauds: SplitMinimums = field(default_factory=lambda: SplitMinimums(train=1, validation=0, test=0))
    # Feature rows by event date, computed once and reused while their inputs are unchanged
    # (pipeline.ingest.feature_update); "" -> <state>/features/<raw store directory name>-<store id>.
    feature_table: str = ""
    # Consecutive dates computed in one pass of the local engine's numpy kernel ([features] engine):
    # the pass holds block + 30 days of payments in the driver's memory, and reads the 30-day
    # lookback once per block. The spark engine computes every stale date in one job.
    feature_block_days: int = 28

    def dataset_root(self) -> Path:
        return resolve_state_path(self.root) if self.root else state_dir() / "datasets" / self.name

    @property
    def window_days(self) -> int:
        return self.train_days + self.validation_days + self.gap_days + self.test_days


PythonLogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


@dataclass(frozen=True)
class LogConfig:
    """The run log (see :mod:`pipeline.ingest.run_log`): Spark, py4j and librdkafka lines of a run
    go to ``<dir>/<run_id>.log`` instead of the terminal."""

    dir: str = "logs/ingest"  # relative paths are under the state directory
    level: PythonLogLevel = "INFO"  # librdkafka and py4j lines; Spark's use [spark].log_level

    def directory(self) -> Path:
        return resolve_state_path(self.dir)


@dataclass(frozen=True)
class IngestConfig:
    spark: SparkConfig = field(default_factory=SparkConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    raw: RawStoreConfig = field(default_factory=RawStoreConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    logs: LogConfig = field(default_factory=LogConfig)


# What SparkContext.setLogLevel accepts (and the run log's log4j configuration).
SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")


def validate_ingest_config(config: IngestConfig, source: str = "ingest.toml") -> IngestConfig:
    """Reject values that type-check but cannot work, naming the key to fix."""
    d = config.dataset
    problems = []
    if d.num_shards_per_date < 1:
        problems.append(f"dataset.num_shards_per_date must be >= 1, got {d.num_shards_per_date}")
    for key in ("train_days", "validation_days", "test_days"):
        if getattr(d, key) < 1:
            problems.append(f"dataset.{key} must be >= 1, got {getattr(d, key)}")
    if d.feature_block_days < 1:
        problems.append(f"dataset.feature_block_days must be >= 1, got {d.feature_block_days}")
    if d.label_maturity_days < 0:
        problems.append(f"dataset.label_maturity_days must be >= 0, got {d.label_maturity_days}")
    if d.gap_days < 0 or 0 < d.gap_days < d.label_maturity_days:
        # Labels taken at the gap's end would be immature for the last validation days otherwise.
        problems.append(f"dataset.gap_days must be 0 or at least label_maturity_days ({d.label_maturity_days}), "
                        f"got {d.gap_days}")
    for key in ("min_rows", "min_frauds"):
        for split, value in vars(getattr(d, key)).items():
            if value < 0:
                problems.append(f"dataset.{key}.{split} must be >= 0, got {value}")
    if config.spark.log_level.upper() not in SPARK_LOG_LEVELS:
        problems.append(f"spark.log_level must be one of {', '.join(SPARK_LOG_LEVELS)}, got {config.spark.log_level!r}")
    if config.source.max_records_per_split < 1 or config.source.fetch_batch < 1:
        problems.append("source.max_records_per_split and source.fetch_batch must be >= 1")
    if config.raw.max_lateness_days <= 0 or config.raw.max_clock_skew_s < 0:
        problems.append("raw.max_lateness_days must be > 0 and raw.max_clock_skew_s >= 0")
    if not 1 <= config.raw.index_lookup_tasks <= BUCKETS:
        problems.append(f"raw.index_lookup_tasks must be in [1, {BUCKETS}] (one task per index bucket at most), "
                        f"got {config.raw.index_lookup_tasks}")
    if config.features.label_delay_hours < 0 or config.features.label_match_days < 1:
        problems.append("features.label_delay_hours must be >= 0 and features.label_match_days >= 1")
    if config.features.engine not in FEATURE_ENGINES:
        problems.append(f"features.engine must be one of {', '.join(FEATURE_ENGINES)}, got {config.features.engine!r}")
    if config.features.hot_key_rows < 1:
        problems.append(f"features.hot_key_rows must be >= 1, got {config.features.hot_key_rows}")
    if config.features.rows_per_task < 1:
        problems.append(f"features.rows_per_task must be >= 1, got {config.features.rows_per_task}")
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))
    return config


def load_ingest_config(env: str | None = None, path: Path | None = None) -> IngestConfig:
    """Load and check ``conf/<env>/ingest.toml`` (or ``path``)."""
    return validate_ingest_config(load_section(IngestConfig, "ingest", env, path), str(path or "ingest.toml"))
