"""What a feature date is computed from, read from the raw store with pyarrow (no Spark job).

* the committed transaction files of each date (immutable once committed: a relative path names
  its content), and the payments of a date range;
* the fraud reports a dataset's features can use (:class:`FraudReports`): per reported transaction
  its first fraud report among the reports the plan reads, when it becomes usable (+ label delay),
  and where its payment lies in the raw store (the identity index's partition date and run
  ordinal), so a date's inputs are known without joining the payments.

The reports follow the Spark build's reading rule exactly (:func:`pipeline.ingest.dataset_builder.spark_window_features`):
reports of ``[label_history_start, label_cutoff]`` by report date, payments of
``[label_match_start, last_date]``, a payment at most ``label_match_days`` before its report.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import Kind
from pipeline.datasets.lookback_cache import FRAUD_SCHEMA, LookbackCache
from pipeline.features.arrow_kernel import epoch_us
from pipeline.features.kernel import US_PER_DAY, KeyedTimes
from pipeline.features.params import FeatureParams
from pipeline.ingest.dataset_plan import DatasetPlan
from pipeline.ingest.id_index import EPOCH
from pipeline.ingest.identity import transaction_id_hashes
from pipeline.ingest.index_build import build_missing_index
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_reader import committed_files_by_date, read_files

NOWHERE = -1  # location of a report whose payment the plan cannot see


def raw_files_keys(store: RawStore, files: dict[date, list[Path]]) -> dict[date, str]:
    """What each date's cache entries are read from: its committed raw files (immutable once
    committed: late data lands as a new file) in this store (its id: a moved store's keys hold)."""
    store_id = store.store_id()

    def key(paths: list[Path]) -> str:
        named = {"raw_store": store_id, "files": sorted(str(p.relative_to(store.root)) for p in paths)}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()

    return {day: key(paths) for day, paths in files.items()}



def files_between(files_by_date: dict[date, list], start: date, end: date) -> list:
    """The files of the dates in ``[start, end]``, in date order."""
    return [f for day in sorted(files_by_date) if start <= day <= end for f in files_by_date[day]]


@dataclass(frozen=True)
class FraudReports:
    """First fraud report per reported transaction, sorted by ``known_us`` then ``id_hash``.

    ``known_us``: report time + label delay (when merchant features may count it);
    ``day``/``run``: the payment's raw partition date (days since 1970) and run ordinal, or
    :data:`NOWHERE` when the plan's payments do not hold it (the Spark join would drop it).
    """

    transaction_id: pa.Array
    id_hash: np.ndarray  # uint64
    reported_us: np.ndarray
    known_us: np.ndarray
    day: np.ndarray
    run: np.ndarray

    def between(self, start_us: int, end_us: int) -> np.ndarray:
        """Indices of the located reports usable in ``[start_us, end_us)``."""
        lo, hi = np.searchsorted(self.known_us, [start_us, end_us], side="left")
        idx = np.arange(lo, hi)
        return idx[self.day[idx] != NOWHERE]


def _first_fraud_reports(store: RawStore, plan: DatasetPlan, params: FeatureParams,
                         cache: LookbackCache) -> tuple[pa.Array, np.ndarray]:
    """``(transaction ids, first report us)`` over the fraud reports the plan reads: each report
    date's from ``cache`` while its label files are unchanged, the other dates read from raw and
    stored back (a night reads one new report date, not some sixty)."""
    by_date = committed_files_by_date(store, Kind.LABEL)
    start, end = plan.label_history_start(params), plan.label_cutoff
    keys = raw_files_keys(store, {d: paths for d, paths in by_date.items() if start <= d <= end})
    stored, missing = cache.read_frauds(keys)
    read = [_frauds_of(d, read_files(by_date[d], Kind.LABEL, ["transaction_id", "is_fraud", "reported_at"]))
            for d in missing]
    frauds = pa.concat_tables([stored, *read])
    if missing:
        cache.write_frauds(frauds, keys)
    first = frauds.group_by("transaction_id").aggregate([("reported_us", "min")])
    return first.column("transaction_id").combine_chunks(), first.column("reported_us_min").to_numpy().astype(np.int64)


def _frauds_of(day: date, labels: pa.Table) -> pa.Table:
    """The fraud reports (``FRAUD_SCHEMA``) among report date ``day``'s ``labels``."""
    frauds = labels.filter(pc.fill_null(labels.column("is_fraud"), False))
    return pa.Table.from_arrays([pa.array(np.full(frauds.num_rows, (day - EPOCH).days, np.int32)),
                                 frauds.column("transaction_id"), pa.array(epoch_us(frauds.column("reported_at")))],
                                schema=FRAUD_SCHEMA)


def fraud_reports(store: RawStore, plan: DatasetPlan, params: FeatureParams, cache: LookbackCache) -> FraudReports:
    """The plan's :class:`FraudReports`, the report dates read through ``cache``. Builds the identity
    index first if the store predates it (call with the raw store's lock held, as every dataset
    build does)."""
    ids, reported = _first_fraud_reports(store, plan, params, cache)
    build_missing_index(store)
    hashes = transaction_id_hashes(ids)
    found = store.id_index(Kind.TRANSACTION).lookup(hashes, keep_mapped=False)  # once a night, in a long-lived driver
    first_day, last_day = ((d - EPOCH).days for d in (plan.label_match_start(params), plan.last_date))
    visible = found.found & (found.days >= first_day) & (found.days <= last_day)
    day = np.where(visible, found.days, NOWHERE).astype(np.int64)
    run = np.where(visible, found.runs, NOWHERE).astype(np.int64)
    known = reported + params.label_delay_us
    order = np.lexsort((hashes, known))
    return FraudReports(ids.take(pa.array(order)), hashes[order], reported[order], known[order], day[order], run[order])


def fraud_known(reports: FraudReports, picked: np.ndarray, payments: pa.Table, params: FeatureParams) -> KeyedTimes:
    """Per merchant, when the frauds of reports ``picked`` became usable: for those whose payment is
    in ``payments`` (``transaction_id, merchant, ts_us``: the merchant coded as the caller's history
    codes it; at least the payments of the picked reports, see
    :func:`pipeline.ingest.block_payments.fraud_payments`) and happened at most ``label_match_days``
    before the report (the twin of ``transforms.fraud_known_events``). Unsorted."""
    asked = pa.table({"transaction_id": reports.transaction_id.take(pa.array(picked, pa.int64())),
                      "reported_us": pa.array(reports.reported_us[picked], pa.int64())})
    matched = asked.join(payments.select(["transaction_id", "merchant", "ts_us"]), "transaction_id", join_type="inner")
    tx_us = matched.column("ts_us").to_numpy().astype(np.int64)
    reported = matched.column("reported_us").to_numpy().astype(np.int64)
    keep = tx_us >= reported - params.label_match_days * US_PER_DAY
    merchant = matched.column("merchant").to_numpy().astype(np.int64)
    return KeyedTimes(merchant[keep], reported[keep] + params.label_delay_us)
