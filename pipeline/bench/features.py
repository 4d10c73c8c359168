"""Feature cost of a night against a full rebuild, and against Spark's own floor, in one run.

The dev layout (conf/dev/ingest.toml: a 27-day window, 30-day lookback, 7 days of maturity) over a
simulated history of 65 days (~1.5 payments per card-day: 12.5k cards, ~1.2M payments; quick: 2k
cards, ~0.2M), committed to a fresh raw store as two runs: everything up to the first night's run
date, then the next day.

* ``full_rebuild_features_s``: the feature table of the first night's window built from an empty
  table (every date computed, every date read coded into the lookback cache: the cold start, a
  backfill into a new table);
* ``night_features_s``: the next night on a copy of that table (history and lookback cache built):
  fingerprints of every window date checked, the new date computed (``night_dates_computed`` says which)
  with its date merged into the sorted history the rebuild stored;
  ``incremental_speedup`` = full / night (goal >= 30);
* ``night_storing_history_s``: the same night when it also stores the merged history (30 days of
  payments, one night in ``block_payments.REBASE_DAYS`` does); ``night_amortized_s`` weighs the two
  as a run of nights does, ``incremental_speedup_amortized`` = full / that;
* ``spark_floor_s``: Spark's bare two passes over the same rows the full rebuild reads (shuffle
  and sort by merchant, then by card; 8 columns; no kernel, no output), warm, in the same session
  settings as the ingest benchmark; ``features_to_floor`` = full rebuild / floor (goal <= 2.5);
* ``spark_full_rebuild_features_s``: the previous way, one Spark job running the kernel over the
  window and its lookback (:func:`pipeline.ingest.dataset_builder.spark_window_features`), warm;
  ``night_vs_spark_full_rebuild`` = that / night.

Why ``incremental_speedup`` has a ceiling here: a night no longer reads its lookback from raw
Parquet, nor sorts it again (it merges the new date's payments into the 30 days it carried sorted
per key, see :mod:`pipeline.ingest.block_payments`), nor the window's sixty dates of label files,
nor matches every report again (the cache keeps each report date's fraud reports and each report's
matched payment), nor reads every cached date to decide on a compaction (one footer). But the
kernel still searches and sums over the 31-day history of the day's cards and merchants (~0.6M
payments) to answer one day of queries: prefix sums, window positions, the hour and country layouts
and the merchant-pair index are linear in the history, about a quarter of a night. The rest is paid once per build whatever it
computes: the identity-index lookup of the window's reports, file listings and fingerprints, the
merge itself (a copy of the history), and publishing the new partition (its Parquet encoding, the
same bytes whichever engine writes them, and its fsyncs). The full rebuild runs the same kernel over
57 days and pays per date for raw reads, coding and partition writes, so a faster kernel shortens
both, and the ratio grows only with what a night alone is spared.

Each figure is the median of ``REPEATS`` runs. The online fields (``online_feature_us_p50/p99``,
``online_big_merchant_ratio``) come from :mod:`pipeline.bench.online_features`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from unittest.mock import patch

import pandas as pd
from pyspark.sql import functions as F

from pipeline.bench import online_features
from pipeline.bench.ingest import bench_ingest_config
from pipeline.bench.process_rss import PeakRss
from pipeline.contract import Kind
from pipeline.datasets.feature_table import FeatureTable
from pipeline.features.arrow_kernel import PAYMENT_COLUMNS
from pipeline.ingest import block_payments
from pipeline.ingest.config import IngestConfig, load_ingest_config
from pipeline.ingest.dataset_builder import spark_window_features
from pipeline.ingest.dataset_plan import DatasetPlan, plan_nightly
from pipeline.ingest.feature_update import update_feature_table
from pipeline.ingest.raw_commit import commit_raw_run
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_store import read_raw_table
from pipeline.ingest.session import build_spark_session
from pipeline.simulation import SimulationConfig, simulate

REPEATS = 3
START = date(2026, 1, 1)


def _history(quick: bool, config: IngestConfig):
    """The simulation and the first night's run date: lookback, window, maturity, one more night."""
    d = config.dataset
    first_run = START + timedelta(days=30 + d.window_days - 1 + d.label_maturity_days)
    days = (first_run - START).days + 2
    sim = simulate(SimulationConfig(seed=3, start_date=START.isoformat(), days=days,
                                    num_cards=2_000 if quick else 12_500, num_merchants=2_000))
    return sim, first_run


def _before(frame: pd.DataFrame, column: str, end: date, start: date | None = None) -> pd.DataFrame:
    when = pd.to_datetime(frame[column], utc=True)
    keep = when < pd.Timestamp(end, tz="UTC")
    if start is not None:
        keep &= when >= pd.Timestamp(start, tz="UTC")
    return frame[keep]


def _commit_nights(store: RawStore, sim, first_run: date) -> None:
    """Run ``history``: everything made by the end of the first run date; run ``night``: the next day."""
    tx, labels = sim.transactions, sim.labels
    end, next_end = first_run + timedelta(days=1), first_run + timedelta(days=2)
    with store.locked():
        commit_raw_run(store, "history", _before(tx, "event_time", end), _before(labels, "reported_at", end))
        commit_raw_run(store, "night", _before(tx, "event_time", next_end, end),
                       _before(labels, "reported_at", next_end, end))


def _median_seconds(run: Callable[[int], object], before: Callable[[], object] = lambda: None) -> tuple[float, object]:
    """Median seconds of ``REPEATS`` calls of ``run(i)`` (``before()`` untimed ahead of each), and the last result."""
    seconds, result = [], None
    for i in range(REPEATS):
        before()
        started = time.perf_counter()
        result = run(i)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def _table_figures(store: RawStore, tmp: Path, config: IngestConfig, first: DatasetPlan, second: DatasetPlan) -> dict:
    params, block = config.features, config.dataset.feature_block_days

    def full(i: int):
        with store.locked():
            return update_feature_table(store, FeatureTable(tmp / f"full-{i}"), first, params, block)

    def night(i: int):
        shutil.copytree(tmp / "full-0", tmp / f"night-{i}")  # the history, built
        os.sync()  # written long before a real night: its fsyncs must not flush the copy's pages
        with store.locked():
            started = time.perf_counter()
            update = update_feature_table(store, FeatureTable(tmp / f"night-{i}"), second, params, block)
        return update, time.perf_counter() - started

    full_s, _ = _median_seconds(full, before=os.sync)  # each run flushes its own writes, not the last run's
    with PeakRss() as rss:
        nights = [night(i) for i in range(REPEATS)]
    night_s = statistics.median(s for _, s in nights)
    with patch.object(block_payments, "REBASE_DAYS", 1):  # the night that also stores the merged history
        storing_s = statistics.median(night(REPEATS + i)[1] for i in range(REPEATS))
    amortized_s = ((block_payments.REBASE_DAYS - 1) * night_s + storing_s) / block_payments.REBASE_DAYS
    return {"full_rebuild_features_s": round(full_s, 3), "night_features_s": round(night_s, 3),
            "incremental_speedup": round(full_s / night_s, 2), "night_storing_history_s": round(storing_s, 3),
            "night_amortized_s": round(amortized_s, 3), "incremental_speedup_amortized": round(full_s / amortized_s, 2),
            "night_dates_computed": list(nights[-1][0].computed),
            "night_peak_rss_mb": round(rss.peak_mb), "window_dates": len(nights[-1][0].computed) + nights[-1][0].reused}


def _spark_figures(store: RawStore, tmp: Path, config: IngestConfig, plan: DatasetPlan) -> dict:
    spark_config = bench_ingest_config(tmp / "raw").spark
    spark = build_spark_session(spark_config)
    try:
        tx = (read_raw_table(spark, store, Kind.TRANSACTION, plan.feature_history_start(), plan.last_date)
              .select(*PAYMENT_COLUMNS).cache())
        rows = tx.count()  # materialised: both sides time their passes, not the Parquet scan
        partitions = spark_config.shuffle_partitions

        def floor(_: int) -> None:
            (tx.repartition(partitions, "merchant_id").sortWithinPartitions("merchant_id", "event_time")
             .repartition(partitions, "card_id").sortWithinPartitions("card_id", "event_time")
             .write.format("noop").mode("overwrite").save())

        def kernel(_: int) -> None:
            (spark_window_features(spark, store, plan, config.features).select(F.col("transaction_id"))
             .write.format("noop").mode("overwrite").save())

        floor(-1)  # warm: JVM code paths
        floor_s, _ = _median_seconds(floor)
        kernel(-1)  # warm: the kernel's Python workers
        kernel_s, _ = _median_seconds(kernel)
        tx.unpersist()
    finally:
        spark.stop()
    return {"rows": rows, "spark_floor_s": round(floor_s, 3), "spark_full_rebuild_features_s": round(kernel_s, 3),
            "master": spark_config.master, "shuffle_partitions": partitions}


def run(quick: bool) -> dict:
    config = load_ingest_config("dev")  # the dev layout; the raw store and table are this run's own
    sim, first_run = _history(quick, config)
    first, second = plan_nightly(first_run, config.dataset), plan_nightly(first_run + timedelta(days=1), config.dataset)
    with tempfile.TemporaryDirectory() as tmp:
        store = RawStore(Path(tmp) / "raw")
        _commit_nights(store, sim, first_run)
        table = _table_figures(store, Path(tmp), config, first, second)
        spark = _spark_figures(store, Path(tmp), config, first)
    million = spark["rows"] / 1e6
    return {**table, **spark, "features_to_floor": round(table["full_rebuild_features_s"] / spark["spark_floor_s"], 3),
            "spark_full_to_floor": round(spark["spark_full_rebuild_features_s"] / spark["spark_floor_s"], 3),
            "night_vs_spark_full_rebuild": round(spark["spark_full_rebuild_features_s"] / table["night_features_s"], 2),
            "full_rebuild_s_per_million": round(table["full_rebuild_features_s"] / million, 3),
            "spark_floor_s_per_million": round(spark["spark_floor_s"] / million, 3),
            "window": [first.first_date.isoformat(), first.last_date.isoformat()],
            "block_days": config.dataset.feature_block_days, "repeats": REPEATS, **online_features.measure(quick)}
