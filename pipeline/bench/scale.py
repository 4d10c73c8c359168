"""``fraudctl bench scale``: the nightly feature step and the identity check at 1x, 4x and 16x the dev
portfolio's payments per day, per process, on ``local-cluster``.

The portfolio grows by shards: shard ``i`` is the dev simulation (conf/dev/simulation.toml, its cards,
merchants and rate) with its own seed, its card, merchant and device ids prefixed ``s<i>.``; the 4x
portfolio is shards 0-3, the 16x one shards 0-15 (quick: a tenth of the dev cards per shard). Shards are
simulated and committed one at a time, so the bench's own memory stays one shard's whatever the size, and
the sizes share one raw store: each size adds its new shards.

Each shard covers the night's date ``D`` and its 30-day lookback. Its days before ``D`` are committed as
one run; then, for each size:

1. **identity check**: the new shards' payments of ``D`` (a night's new records) looked up in the
   identity index of everything committed, each way in a fresh process: all of them in one process
   (:meth:`pipeline.ingest.id_index.IdIndex.lookup`, what every read task did before the lookup was
   sharded), then one lookup task's share (:func:`pipeline.ingest.store_copies.lookup_buckets` over one
   of the index's 16 buckets, from the night's probe, which the first process wrote: what each of
   ``[raw] index_lookup_tasks`` = 16 tasks does); then those payments are committed as the night's runs;
2. **feature night**: ``D``'s feature partition computed into a fresh feature table by the ``spark``
   engine (:mod:`pipeline.ingest.feature_update`) on ``local-cluster[2,1,1024]``, in a fresh process as
   the nightly's spark-submit is; the ``local`` engine (the same step in one process) is its peer at the
   sizes up to :data:`LOCAL_MAX_MULTIPLE` (beyond, it would hold the whole lookback in one process: ~1.2
   kB a payment).

Peak RSS is sampled (:mod:`pipeline.bench.process_rss`) over the child's process tree and split by process: the
driver (the Python process and its JVM) and each executor (its JVM and the Python workers it forks).
``s_per_million`` is the night's seconds (the update call, not the session start) per million payments
of ``D``; shuffle bytes are Spark's own count (the driver's status store) for the night's jobs.

The night runs as dev configures it (``[features] hot_key_rows`` and ``rows_per_task``: shuffle
partitions grow with the payments read) with a :data:`DRIVER_MEMORY_MB` driver heap; each size also
reports the driver's heap after a full collection at the night's end, what the driver still holds.

Goals (issue 37): driver RSS at 16x at most 1.2x of 1x; each executor under its configured bound
(``spark.executor.memory`` + ``spark.executor.memoryOverhead``); seconds per million payments at 16x at
most 1.3x of 1x.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from pipeline.bench.process_rss import OwnPeak, TreePeaks
from pipeline.contract import Kind
from pipeline.datasets.feature_table import FeatureTable
from pipeline.datasets.manifest import DateWindow
from pipeline.features import definitions as fd
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.dataset_plan import DatasetPlan
from pipeline.ingest.id_index import BUCKETS, bucket_of
from pipeline.ingest.identity import identity_hashes
from pipeline.ingest.raw_commit import commit_raw_run, raw_table
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.store_copies import PROBE_SUFFIX, lookup_buckets, write_probe
from pipeline.paths import state_dir
from pipeline.simulation import SimulationConfig, load_simulation_config, simulate

MULTIPLES = (1, 4, 16)
LOCAL_MAX_MULTIPLE = 4
QUICK_CARD_SHARE = 0.1  # --quick: each shard a tenth of the dev portfolio
START = date(2026, 1, 1)
NIGHT = START + timedelta(days=fd.LOOKBACK_DAYS)  # D: the lookback's 30 days come before it
MASTER = "local-cluster[2,1,1024]"
EXECUTOR_MEMORY_MB = 1024  # the local-cluster spec's executor memory (JVM heap)
EXECUTOR_OVERHEAD_MB = 1536  # off-heap and the Python workers: the rest of an executor's budget
# The night's driver JVM heap. The driver holds metadata only (file lists, the plan, one summary row per
# date), so a heap this small must do at every size: one that did not would fail the night, not grow.
# A JVM takes heap lazily up to its maximum as its collector sees fit, so under a large maximum (dev's
# 2g) its RSS measures collector timing rather than what it holds; heap_after_gc_mb reports that.
DRIVER_MEMORY_MB = 512
DRIVER_RSS_GROWTH_GOAL = 1.2
S_PER_MILLION_GROWTH_GOAL = 1.3


# ---- the portfolio, shard by shard -------------------------------------------------------------------


def shard_simulation(base: SimulationConfig, shard: int, quick: bool) -> SimulationConfig:
    """The dev portfolio's shard ``shard``: its own seed, the dev cards and merchants (a tenth: quick),
    the night and its lookback."""
    share = QUICK_CARD_SHARE if quick else 1.0
    return dataclasses.replace(base, seed=base.seed + 1009 * shard, start_date=START.isoformat(),
                               days=fd.LOOKBACK_DAYS + 1, num_cards=max(1, round(base.num_cards * share)),
                               num_merchants=max(1, round(base.num_merchants * share)))


def prefix_ids(transactions: pd.DataFrame, shard: int) -> pd.DataFrame:
    """``transactions`` with card, merchant and device ids made the shard's own (``s<shard>.``): the
    shards' populations are disjoint, as a bigger issuer's cards and merchants are."""
    out = transactions.copy()
    for column in ("card_id", "merchant_id", "device_id"):
        out[column] = f"s{shard}." + out[column].astype("string")
        out[column] = out[column].astype(object).where(transactions[column].notna(), None)
    return out


def _split_at(frame: pd.DataFrame, column: str, day: date) -> tuple[pd.DataFrame, pd.DataFrame]:
    when = pd.to_datetime(frame[column], utc=True)
    start, end = pd.Timestamp(day, tz="UTC"), pd.Timestamp(day + timedelta(days=1), tz="UTC")
    return frame[when < start], frame[(when >= start) & (when < end)]


@dataclass(frozen=True)
class ShardNight:
    """What a shard's night brings: its payments of ``D`` and the fraud reports made that day."""

    transactions: pd.DataFrame
    labels: pd.DataFrame


def commit_shard_history(store: RawStore, base: SimulationConfig, shard: int, quick: bool) -> ShardNight:
    """Simulate shard ``shard`` and commit its days before ``D`` (payments and reports) as one run;
    return its night, uncommitted."""
    sim = simulate(shard_simulation(base, shard, quick))
    history_tx, night_tx = _split_at(prefix_ids(sim.transactions, shard), "event_time", NIGHT)
    history_labels, night_labels = _split_at(sim.labels, "reported_at", NIGHT)
    with store.locked():
        commit_raw_run(store, f"history-s{shard}", history_tx, history_labels)
    return ShardNight(night_tx, night_labels)


def night_plan() -> DatasetPlan:
    """One date, ``D``: the feature step of a night, whatever the dataset's window around it."""
    day = DateWindow(NIGHT.isoformat(), NIGHT.isoformat())
    return DatasetPlan(NIGHT, {"train": day, "test": day})


# ---- one phase in its own process ----------------------------------------------------------------


def run_child(args: list[str]) -> tuple[dict, TreePeaks]:
    """Run ``python -m pipeline.bench.scale <args>`` (one phase, in a fresh process as a night's job
    is), sampling its tree; its result is the JSON of its last stdout line."""
    child = subprocess.Popen([sys.executable, "-m", "pipeline.bench.scale", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    with TreePeaks(child.pid) as peaks:
        out, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"bench scale phase {args[0]} failed (exit {child.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1]), peaks


# ---- the two phases, each in its own process ---------------------------------------------------------


def check_phase(store: Path, records: Path, way: str) -> dict:
    """Identity check of ``records`` (raw transactions) against the store's index: seconds, records
    looked up, hits. ``way`` "whole": every record in this process, and the probe of them all written
    beside ``records`` (what the night's read tasks write); "task": one lookup task, bucket 0's records
    from that probe (this process reads nothing else: its memory is the task's)."""
    index = RawStore(store).id_index(Kind.TRANSACTION)
    probe = records.with_name(records.stem + PROBE_SUFFIX)
    if way == "whole":
        rows = pq.read_table(records)
        ids = identity_hashes(rows, Kind.TRANSACTION)
        with OwnPeak() as peak:
            started = time.perf_counter()
            found = int(index.lookup(ids).found.sum())
            seconds = time.perf_counter() - started
        write_probe(probe, ids)
        return {"seconds": seconds, "records": rows.num_rows, "found": found, "growth_mb": peak.growth_mb}
    with OwnPeak() as peak:
        started = time.perf_counter()
        found = lookup_buckets(str(index.root), index.segments, [str(probe)], 0, 1).num_rows
        seconds = time.perf_counter() - started
    h1 = np.load(probe, mmap_mode="r")[0]
    return {"seconds": seconds, "records": int((bucket_of(h1) == 0).sum()), "found": found,
            "growth_mb": peak.growth_mb}


def shuffle_write_bytes(spark) -> int:
    """Bytes every stage of this session wrote to shuffle, from the driver's status store."""
    gateway = spark.sparkContext._gateway
    stages = spark.sparkContext._jsc.sc().statusStore().stageList(
        None, False, False, gateway.new_array(gateway.jvm.double, 0), gateway.jvm.java.util.ArrayList())
    total, it = 0, stages.iterator()
    while it.hasNext():
        total += it.next().shuffleWriteBytes()
    return int(total)


def features_phase(store: Path, table: Path, engine: str) -> dict:
    """``D``'s feature partition computed into ``table`` by ``engine``: seconds of the update alone."""
    from pipeline.ingest.feature_update import update_feature_table

    config = load_ingest_config("dev")
    raw = RawStore(store)
    spark = None
    if engine == "spark":
        from pipeline.ingest.session import build_spark_session

        conf = {**config.spark.conf, "spark.executor.memoryOverhead": f"{EXECUTOR_OVERHEAD_MB}m"}
        spark = build_spark_session(dataclasses.replace(config.spark, conf=conf,
                                                        driver_memory=f"{DRIVER_MEMORY_MB}m"), master=MASTER)
    try:
        with raw.locked():
            started = time.perf_counter()
            update = update_feature_table(raw, FeatureTable(table), night_plan(), config.features,
                                          config.dataset.feature_block_days, engine=engine, spark=spark,
                                          hot_key_rows=config.features.hot_key_rows,
                                          rows_per_task=config.features.rows_per_task)
            seconds = time.perf_counter() - started
        shuffle = shuffle_write_bytes(spark) if spark is not None else 0
        heap = driver_heap_mb(spark) if spark is not None else {}
    finally:
        if spark is not None:
            spark.stop()
    rows = pq.read_metadata(FeatureTable(table).partition_file(NIGHT)).num_rows
    return {"seconds": seconds, "computed": list(update.computed), "rows": rows, "shuffle_write_bytes": shuffle,
            "shuffle_partitions": update.shuffle_partitions, **heap}


def driver_heap_mb(spark) -> dict[str, float]:
    """The driver JVM's heap after a full collection (what it still holds once the night is done) and
    the heap it has committed (what its RSS carries), in MB."""
    jvm = spark.sparkContext._jvm
    jvm.java.lang.System.gc()
    runtime = jvm.java.lang.Runtime.getRuntime()
    return {"heap_after_gc_mb": round((runtime.totalMemory() - runtime.freeMemory()) / 2**20, 1),
            "heap_committed_mb": round(runtime.totalMemory() / 2**20, 1)}


# ---- the bench ---------------------------------------------------------------------------------------


def live_index(store: RawStore) -> tuple[int, int]:
    """``(entries, bytes)`` of the transaction table's live identity-index segments (what a lookup
    searches; superseded segments a merge left behind are not counted)."""
    index = store.id_index(Kind.TRANSACTION)
    buckets = [index.root / segment / f"bucket-{b:02d}.npy" for segment in index.segments for b in range(BUCKETS)]
    return (sum(np.load(p, mmap_mode="r").shape[1] for p in buckets if p.exists()),
            sum(p.stat().st_size for p in buckets if p.exists()))


def growth(sizes: list[dict], field: str) -> float | None:
    """The largest size's ``field`` over the smallest's (None when either is missing)."""
    first, last = sizes[0].get(field), sizes[-1].get(field)
    return round(last / first, 3) if first and last is not None else None


def run(quick: bool) -> dict:
    base = load_simulation_config("dev")
    sizes: list[dict] = []
    with tempfile.TemporaryDirectory(dir=state_dir()) as tmp:
        root = Path(tmp)
        store = RawStore(root / "raw")
        shards = 0
        for multiple in MULTIPLES:
            nights = []
            while shards < multiple:
                nights.append(commit_shard_history(store, base, shards, quick))
                shards += 1
            records = root / f"night-{multiple}.parquet"
            night_tx = pd.concat([n.transactions for n in nights], ignore_index=True)
            pq.write_table(raw_table(Kind.TRANSACTION, night_tx), records)
            check, check_peaks = run_child(["check", str(store.root), str(records), "whole"])
            task, task_peaks = run_child(["check", str(store.root), str(records), "task"])
            with store.locked():
                for i, night in enumerate(nights):
                    commit_raw_run(store, f"night-{multiple}-{i}", night.transactions, night.labels)
            spark, spark_peaks = run_child(["features", str(store.root), str(root / f"table-spark-{multiple}"), "spark"])
            size = {
                "multiple": multiple, "payments_per_day": _payments(store, NIGHT, NIGHT), "shards": shards,
                "lookback_payments": _payments(store, NIGHT - timedelta(days=fd.LOOKBACK_DAYS), NIGHT),
                "driver_peak_rss_mb": spark_peaks.mb("driver"),
                "driver_python_peak_rss_mb": spark_peaks.mb("driver_python"),
                "driver_jvm_peak_rss_mb": spark_peaks.mb("driver_jvm"),
                "driver_heap_after_gc_mb": spark["heap_after_gc_mb"],
                "driver_heap_committed_mb": spark["heap_committed_mb"],
                "executor_peak_rss_mb": max(spark_peaks.executor_mb(), default=0.0),
                "executors_peak_rss_mb": spark_peaks.executor_mb(),
                "s_per_million": None, "night_s": round(spark["seconds"], 3), "feature_rows": spark["rows"],
                "shuffle_write_bytes": spark["shuffle_write_bytes"], "shuffle_partitions": spark["shuffle_partitions"],
                "identity_check_s": round(check["seconds"], 4), "identity_check_records": check["records"],
                "identity_check_s_per_million": round(check["seconds"] / check["records"] * 1e6, 3),
                "identity_check_peak_rss_mb": check_peaks.mb("driver_python"),
                # The lookup's own resident growth (kernel high-water mark): the index pages it touched.
                "identity_check_lookup_growth_mb": round(check["growth_mb"], 1),
                "identity_task_lookup_growth_mb": round(task["growth_mb"], 1),
                "identity_task_s": round(task["seconds"], 4), "identity_task_records": task["records"],
                "identity_task_s_per_million": round(task["seconds"] / max(task["records"], 1) * 1e6, 3),
                "identity_task_peak_rss_mb": task_peaks.mb("driver_python"),
            }
            size["index_entries"], size["index_bytes"] = live_index(store)
            size["s_per_million"] = round(spark["seconds"] / size["payments_per_day"] * 1e6, 3)
            if multiple <= LOCAL_MAX_MULTIPLE:
                local, local_peaks = run_child(["features", str(store.root), str(root / f"table-local-{multiple}"),
                                                "local"])
                if local["rows"] != spark["rows"]:
                    raise RuntimeError(f"at {multiple}x the engines disagree: local {local['rows']} rows, "
                                       f"spark {spark['rows']}")
                size |= {"local_driver_peak_rss_mb": local_peaks.mb("driver"),
                         "local_s_per_million": round(local["seconds"] / size["payments_per_day"] * 1e6, 3),
                         "local_night_s": round(local["seconds"], 3)}
            sizes.append(size)
    bound = EXECUTOR_MEMORY_MB + EXECUTOR_OVERHEAD_MB
    driver_growth, seconds_growth = growth(sizes, "driver_peak_rss_mb"), growth(sizes, "s_per_million")
    return {
        "sizes": sizes, "driver_rss_growth": driver_growth, "s_per_million_growth": seconds_growth,
        "local_driver_rss_growth": growth([s for s in sizes if "local_driver_peak_rss_mb" in s],
                                          "local_driver_peak_rss_mb"),
        "executor_rss_bound_mb": bound,
        "goal_met": {
            f"driver_rss_growth_at_most_{DRIVER_RSS_GROWTH_GOAL}": driver_growth is not None
            and driver_growth <= DRIVER_RSS_GROWTH_GOAL,
            "executor_rss_within_bound": all(s["executor_peak_rss_mb"] <= bound for s in sizes),
            f"s_per_million_growth_at_most_{S_PER_MILLION_GROWTH_GOAL}": seconds_growth is not None
            and seconds_growth <= S_PER_MILLION_GROWTH_GOAL,
        },
        "master": MASTER, "night": NIGHT.isoformat(), "lookback_days": fd.LOOKBACK_DAYS,
        "executor_memory_mb": EXECUTOR_MEMORY_MB, "executor_overhead_mb": EXECUTOR_OVERHEAD_MB,
        "driver_memory_mb": DRIVER_MEMORY_MB,
        "cards_per_shard": shard_simulation(base, 0, quick).num_cards,
        "local_engine_up_to_multiple": LOCAL_MAX_MULTIPLE,
    }


def _payments(store: RawStore, first: date, last: date) -> int:
    """Payments committed for the dates ``first..last`` (from the files' footers)."""
    days = ((first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1))
    return sum(pq.read_metadata(p).num_rows for day in days
               for p in (store.table_path(Kind.TRANSACTION) / f"event_date={day}").rglob("*.parquet"))


def main(argv: list[str] | None = None) -> None:
    """A phase of the bench in this process (run by :func:`run_child`); prints its JSON result."""
    parser = argparse.ArgumentParser(prog="python -m pipeline.bench.scale")
    phases = parser.add_subparsers(dest="phase", required=True)
    check = phases.add_parser("check")
    check.add_argument("store", type=Path)
    check.add_argument("records", type=Path)
    check.add_argument("way", choices=("whole", "task"))
    features = phases.add_parser("features")
    features.add_argument("store", type=Path)
    features.add_argument("table", type=Path)
    features.add_argument("engine", choices=("local", "spark"))
    args = parser.parse_args(argv)
    result = check_phase(args.store, args.records, args.way) if args.phase == "check" else \
        features_phase(args.store, args.table, args.engine)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
