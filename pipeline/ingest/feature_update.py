"""Bring the feature table up to date for a dataset plan: compute only the dates whose inputs changed.

A date's features are a function of (see :mod:`pipeline.features.definitions`):

1. the payments of the date and of its ``LOOKBACK_DAYS`` before it: the committed raw files of
   those dates, immutable once committed (a late payment lands as a new file);
2. the frauds usable in its windows: the first fraud reports whose ``reported_at + label_delay``
   falls in ``[date - LOOKBACK_DAYS, date + 1)``, and where their payments lie in the raw store
   (a report whose payment is unknown counts for nothing until the payment lands);
3. the feature code and knobs: feature schema, ``label_delay_hours``, ``label_match_days``,
   :data:`TABLE_FORMAT`, and the raw store it was read from (its id, :meth:`RawStore.store_id`).

The fingerprint of a date is a SHA-256 over exactly these. :func:`update_feature_table` computes
every fingerprint of the plan's dates (a directory listing and the plan's fraud reports, no feature
work), keeps the partitions whose stored fingerprint matches and recomputes the rest: the new dates,
and those a late payment or a back-dated report reached. Two engines compute them (``[features]
engine``), with the same kernel, into the same partitions, byte for byte (one writer:
:func:`~pipeline.datasets.feature_table.write_partition_file`):

* ``local``: dates are grouped into blocks of at most ``block_days`` consecutive dates; each block
  reads its payments plus the 30-day lookback once and runs the exact numpy kernel in this process
  (:func:`arrow_kernel.feature_rows`), where a Spark job costs more than that in its shuffles alone
  on small portfolios. The lookback comes from the table's lookback cache
  (:mod:`pipeline.ingest.block_payments`): a night reads its new date's raw files and merges them
  into the 30 days it carried sorted per key from the night before, not 31 dates of raw Parquet
  sorted again; the fraud reports of the new report date, not some sixty dates of label files; and
  matches only the reports it has not matched before. Memory: one block's payments
  (``block_days + 30`` days), in this process.
* ``spark``: every stale date in one Spark job (:mod:`pipeline.ingest.feature_update_spark`):
  executors read the raw files, run the kernel (hot keys split in time chunks, ``hot_key_rows``)
  and write each date's file into a staging directory; this process holds only metadata (file
  lists, fingerprints, the plan's fraud reports) and publishes. It reads the lookback's raw files,
  not the lookback cache.

Either way each date is published whole, its fingerprint written last (:meth:`FeatureTable.publish_staged`).

Guarantee: the rows of every partition equal those the Spark build over the whole window computes
(:func:`pipeline.ingest.dataset_builder.spark_window_features`), value for value; tested in
``tests/ingest/test_feature_update.py``; the spark engine's files equal the local engine's, byte for
byte, in ``tests/ingest/test_feature_update_spark.py``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind
from pipeline.datasets.feature_table import FeatureTable
from pipeline.datasets.lookback_cache import LookbackCache
from pipeline.features import definitions as fd
from pipeline.features.arrow_kernel import sorted_feature_rows
from pipeline.features.kernel import US_PER_DAY
from pipeline.features.params import FeatureParams
from pipeline.ingest.block_payments import fraud_payments, read_block_payments
from pipeline.ingest.config import FEATURE_ENGINES
from pipeline.ingest.dataset_plan import DatasetPlan
from pipeline.ingest.feature_inputs import (
    FraudReports,
    committed_files_by_date,
    files_between,
    fraud_known,
    fraud_reports,
)
from pipeline.ingest.id_index import EPOCH
from pipeline.ingest.raw_layout import RawStore
from pipeline.paths import resolve_state_path, state_dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Bump when a partition's content or the fingerprint's recipe changes. 2: the raw store is named by
# its id, not its path (a moved store's dates stay valid).
TABLE_FORMAT = 2
LOOKBACK = timedelta(days=fd.LOOKBACK_DAYS)

log = logging.getLogger(__name__)


def feature_table_root(configured: str, store: RawStore) -> Path:
    """The feature table of ``store``: ``configured`` when set, else
    ``<state>/features/<store dir name>-<store id>`` (:meth:`RawStore.store_id`; may write it, so
    call with the store's lock held, as dataset builds do). One table per raw store, next to the
    datasets: two stores never share one, even named alike, and a moved store keeps its own.

    Tables keyed by the directory name alone (``<state>/features/<store dir name>``, before the id)
    are not read: their fingerprints named the store's path, so every date would be computed again
    anyway, and a name may have been shared by two stores. Each call finds such a table logs a
    warning naming it; delete it once no older build uses it.
    """
    if configured:
        return resolve_state_path(configured)
    features = state_dir() / "features"
    legacy = features / store.root.name
    if legacy.is_dir():
        log.warning("%s is a feature table of the old layout (keyed by the raw store's directory name), no longer "
                    "read: the features of %s are computed into their own table; delete it when no older "
                    "build needs it", legacy, store.root)
    return features / f"{store.root.name}-{store.store_id()[:12]}"


class FeatureEngineError(ValueError):
    """An engine that does not exist, or the spark engine without a Spark session."""


@dataclass(frozen=True)
class FeatureUpdate:
    """What one update did: dates computed (new or changed inputs) and dates reused, by which
    engine; the spark engine's kernel calls per pass (:class:`~pipeline.ingest.feature_update_spark.SparkFeatureRun`)."""

    computed: tuple[str, ...]
    reused: int
    seconds: float
    engine: str = "local"
    kernel_calls: dict = field(default_factory=dict)
    shuffle_partitions: int = 0  # the spark engine's, per pass (0: no Spark job)

    def to_dict(self) -> dict:
        out = {"computed": list(self.computed), "reused": self.reused, "seconds": round(self.seconds, 3),
               "engine": self.engine}
        out |= {"kernel_calls": self.kernel_calls} if self.kernel_calls else {}
        return out | ({"shuffle_partitions": self.shuffle_partitions} if self.shuffle_partitions else {})


def plan_dates(plan: DatasetPlan) -> list[date]:
    return [plan.first_date + timedelta(days=i) for i in range((plan.last_date - plan.first_date).days + 1)]


def date_fingerprints(store: RawStore, files: dict[date, list[Path]], days: list[date], reports: FraudReports,
                      params: FeatureParams) -> dict[date, tuple[str, dict]]:
    """``day -> (fingerprint, summary of its inputs)`` for each of ``days`` (module doc, 1-3);
    ``files``: the committed transaction files per date."""
    code = {"format": TABLE_FORMAT, **fd.schema_fingerprint(), "label_delay_us": params.label_delay_us,
            "label_match_days": params.label_match_days, "raw_store": store.store_id()}
    named = {day: [str(p.relative_to(store.root)) for p in paths] for day, paths in files.items()}
    out = {}
    for day in days:
        payments = files_between(named, day - LOOKBACK, day)
        start_us = (day - EPOCH - LOOKBACK).days * US_PER_DAY
        picked = reports.between(start_us, start_us + (fd.LOOKBACK_DAYS + 1) * US_PER_DAY)
        digest = hashlib.sha256(json.dumps({**code, "payments": payments}, sort_keys=True).encode())
        for values in (reports.id_hash, reports.reported_us, reports.day, reports.run):
            digest.update(np.ascontiguousarray(values[picked]).tobytes())
        out[day] = (digest.hexdigest(), {"payment_files": len(payments), "fraud_reports": len(picked)})
    return out


def blocks(days: list[date], block_days: int) -> list[list[date]]:
    """``days`` (sorted) cut into runs of consecutive dates of at most ``block_days``."""
    out: list[list[date]] = []
    for day in days:
        if out and day - out[-1][-1] == timedelta(days=1) and len(out[-1]) < block_days:
            out[-1].append(day)
        else:
            out.append([day])
    return out


def compute_block(store: RawStore, cache: LookbackCache, files: dict[date, list[Path]], days: list[date],
                  reports: FraudReports, params: FeatureParams) -> dict[date, pa.Table]:
    """Feature rows of the consecutive ``days``, per date, from their lookback's payments (read
    through ``cache``, which this updates: :mod:`pipeline.ingest.block_payments`)."""
    first, last = days[0], days[-1]
    start_us = (first - EPOCH - LOOKBACK).days * US_PER_DAY
    picked = reports.between(start_us, ((last - EPOCH).days + 1) * US_PER_DAY)
    payments = read_block_payments(store, cache, files, days)
    named = fraud_payments(store, cache, files, payments, reports.transaction_id.take(pa.array(picked, pa.int64())),
                           reports.day[picked])
    known = fraud_known(reports, picked, named, params)
    rows = sorted_feature_rows(payments.history, known, payments.own, payments.rows)
    row_days = pc.cast(rows.column("event_date"), pa.int32()).to_numpy()
    return {day: rows.filter(pa.array(row_days == (day - EPOCH).days)) for day in days}


def update_feature_table(store: RawStore, table: FeatureTable, plan: DatasetPlan, params: FeatureParams,
                         block_days: int, engine: str = "local", spark: SparkSession | None = None,
                         hot_key_rows: int | None = None, rows_per_task: int | None = None) -> FeatureUpdate:
    """Make every date of ``plan`` hold a partition whose fingerprint matches its current inputs.

    ``engine``: ``"local"`` (blocks of ``block_days`` dates in this process) or ``"spark"`` (one job
    on ``spark``'s executors; ``hot_key_rows``: split hotter keys, None: never; ``rows_per_task``: at
    most this many payments read per shuffle partition, None: ``spark.sql.shuffle.partitions``), see
    the module doc.
    Call with the raw store's lock held (the store must not change while its files are listed and
    read). Each recomputed date is published whole; a kill leaves earlier dates published and the
    rest as they were (the next build recomputes them). The lookback cache keeps the dates from the
    plan's feature history on. Raises :class:`FeatureEngineError` before touching the table for an
    unknown engine or ``spark`` without a session.
    """
    if engine not in FEATURE_ENGINES:
        raise FeatureEngineError(f"unknown feature engine {engine!r}: set [features] engine to one of "
                                 f"{', '.join(FEATURE_ENGINES)}")
    if engine == "spark" and spark is None:
        raise FeatureEngineError("the spark feature engine needs a SparkSession (pass spark=...)")
    started = time.perf_counter()
    cache = table.lookback_cache()
    table.discard_leftovers()
    cache.discard_before(plan.feature_history_start())
    reports = fraud_reports(store, plan, params, cache)
    files = committed_files_by_date(store, Kind.TRANSACTION)
    days = plan_dates(plan)
    fingerprints = date_fingerprints(store, files, days, reports, params)
    stale = [d for d in days if table.fingerprint(d) != fingerprints[d][0]]
    calls: dict = {}
    partitions = 0
    if engine == "spark" and stale:
        from pipeline.ingest.feature_update_spark import write_stale_dates  # Spark only where asked for

        run = write_stale_dates(spark, table, files, stale, reports, params, hot_key_rows, rows_per_task)
        for day, (staging, rows) in run.staged.items():
            table.publish_staged(day, staging, rows, *fingerprints[day])
        calls, partitions = run.kernel_calls, run.shuffle_partitions
    else:
        for block in blocks(stale, block_days):
            for day, rows in compute_block(store, cache, files, block, reports, params).items():
                table.publish(day, rows, *fingerprints[day])
    return FeatureUpdate(tuple(d.isoformat() for d in stale), len(days) - len(stale), time.perf_counter() - started,
                         engine, calls, partitions)
