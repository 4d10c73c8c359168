"""Ingest throughput: our Spark ingest into the raw store vs one Python Kafka reader, interleaved.

Same topic, measured in one run: >= 500k simulated transactions (quick: 60k) in 4 partitions of
an embedded broker started on a free port. (a) baseline: one confluent-kafka consumer drains the
topic and ``json.loads`` each value in this process, the practical limit of one reader here;
(b) ours: :func:`pipeline.ingest.job.run_raw_ingest`, Kafka read on executors, validation,
duplicate and timing screens, Parquet raw store and quarantine, accounting and commit, into a
fresh raw store each time. The two alternate (reader, ingest, reader, ingest, ...) so that load from
elsewhere on this noisy machine hits both sides alike; ``ratio`` is the median of the per-round
ratios (``ratio_runs``). The Spark session is started and warmed before the clock (``spark_start_s``,
``warmup_s``).

Then the feature stage alone: the Spark kernel over every ingested transaction
(``features_s_per_million``; ``features_cold_s*``: the first build, which also starts the kernel's
Python workers), and the online kernel per payment on the same data
(``replay_feature_us_p50/p99``: the simulated payments replayed in event-time order, each timed by
:func:`pipeline.bench.online_features.time_payment`, the operation behind that bench's
``online_feature_us_p50/p99``, which are measured on a filled 30-day state and are not these).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition

from pipeline.bench.online_features import percentiles, time_payment
from pipeline.bench.process_rss import PeakRss
from pipeline.contract import Kind
from pipeline.features.frame import epoch_micros
from pipeline.features.online import OnlineFeatureState, Payment
from pipeline.features.transforms import build_features
from pipeline.ingest.config import IngestConfig, SparkConfig
from pipeline.ingest.duplicates import ARRIVAL, DUPLICATE, arrival_order, classify_copies
from pipeline.ingest.id_index import Entries, IdIndex, counter_layout, segment_span
from pipeline.ingest.identity import transaction_id_hashes
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.progress import quiet
from pipeline.ingest.raw_layout import RawStore
from pipeline.ingest.raw_store import read_raw_table
from pipeline.ingest.session import build_spark_session
from pipeline.kafka.admin import end_offsets
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import SimulationConfig, simulate

PARTITIONS = 4


def baseline_drain(kafka: KafkaConfig, topic: str) -> tuple[int, float]:
    """One consumer, every partition, ``json.loads`` per value: (records, seconds)."""
    ends = {p: high for p, (_, high) in end_offsets(kafka, topic).items()}
    consumer = Consumer({**kafka.confluent(), "group.id": "bench-baseline", "enable.auto.commit": False})
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    remaining, n = dict(ends), 0
    while any(remaining.values()):
        for msg in consumer.consume(num_messages=10_000, timeout=1.0):
            if msg.error():
                continue
            json.loads(msg.value())
            n += 1
            if msg.offset() + 1 >= ends[msg.partition()]:
                remaining[msg.partition()] = 0
    seconds = time.perf_counter() - started
    consumer.close()
    return n, seconds


def _simulation(quick: bool):
    # ~1.5 payments per card-day: 12k cards x 28 days ~ 500k; quick 2k cards x 20 days ~ 60k.
    cards, days = (2_000, 20) if quick else (12_500, 28)
    return simulate(SimulationConfig(seed=3, start_date="2026-01-01", days=days, num_cards=cards,
                                     num_merchants=2_000))


def bench_ingest_config(raw_root: Path) -> IngestConfig:
    """The benchmarks' ingest settings: local[2], 4 shuffle partitions, a raw store at ``raw_root``."""
    base = IngestConfig()
    spark = SparkConfig(master="local[2]", shuffle_partitions=4, log_level="ERROR", driver_memory="3g")
    return dataclasses.replace(base, spark=spark, raw=dataclasses.replace(base.raw, path=str(raw_root)))


def _warm_up(spark, broker: EmbeddedBroker, tmp: Path, sim) -> float:
    """One small ingest (own topics, own store): starts the Python workers the real run reuses."""
    kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers, transactions_topic="warmup-transactions",
                        labels_topic="warmup-labels", partitions=PARTITIONS)
    broker.create_topics(kafka.topics(), PARTITIONS)
    records = sim.transaction_records()
    publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, (next(records) for _ in range(2_000)))
    started = time.perf_counter()
    run_raw_ingest(bench_ingest_config(tmp / "warmup-raw"), kafka, spark=spark, progress=quiet())
    return time.perf_counter() - started


ROUNDS = 3


def _ingest_once(spark, kafka: KafkaConfig, raw_root: Path) -> tuple[object, float]:
    config = bench_ingest_config(raw_root)
    started = time.perf_counter()
    report = run_raw_ingest(config, kafka, spark=spark, progress=quiet())
    return report, time.perf_counter() - started


def _interleaved(spark, kafka: KafkaConfig, tmp: Path, rounds: int,
                 store_for_round: Callable[[int], Path] | None = None) -> list[dict]:
    """``rounds`` x (baseline drain, our ingest into a fresh store), alternating.
    ``store_for_round(i)`` prepares round i's store (default: an empty one)."""
    runs = []
    for i in range(rounds):
        baseline_rows, baseline_s = baseline_drain(kafka, kafka.transactions_topic)
        raw_root = store_for_round(i) if store_for_round else tmp / f"raw-{i}"
        report, ingest_s = _ingest_once(spark, kafka, raw_root)
        rows = report.accounting[0].read
        runs.append({"baseline_rows": baseline_rows, "baseline_s": baseline_s, "rows": rows, "ingest_s": ingest_s,
                     "ratio": (rows / ingest_s) / (baseline_rows / baseline_s), "stages": report.stages,
                     "duplicates": report.accounting[0].duplicates})
    return runs


RESEND_SHARE = 0.10  # of the resend topic's records: copies of payments the store already holds


def _resend_topic(broker: EmbeddedBroker, sim, tmp: Path, spark) -> tuple[KafkaConfig, Path, int]:
    """A store holding the first payments (ingested once), and a topic with the rest plus resends of
    stored payments (10% of its records, byte for byte, at random places, each on its card's
    partition like the original). The topic is as long as the plain one, so the two nights share
    their fixed costs alike and the ratios compare per-record work. Returns (topic settings,
    store, resends)."""
    records = list(sim.transaction_records())
    cut = round(len(records) * RESEND_SHARE)  # new = the other 90%; with the resends, as many records
    history, new = records[:cut], records[cut:]
    rng = random.Random(7)
    resent = rng.choices(history, k=round(len(new) * RESEND_SHARE / (1 - RESEND_SHARE)))
    stream = list(new)
    for record in resent:
        stream.insert(rng.randrange(len(stream) + 1), record)
    kafka = {name: KafkaConfig(bootstrap_servers=broker.bootstrap_servers, transactions_topic=f"resend-{name}",
                               labels_topic="resend-labels", partitions=PARTITIONS) for name in ("history", "stream")}
    for config, values in ((kafka["history"], history), (kafka["stream"], stream)):
        broker.create_topics(config.topics(), PARTITIONS)
        assert publish_records(config, config.transactions_topic, Kind.TRANSACTION, values).ok
    history_root = tmp / "resend-history"
    run_raw_ingest(bench_ingest_config(history_root), kafka["history"], spark=spark, progress=quiet())
    return kafka["stream"], history_root, len(resent)


def _with_resends(spark, broker: EmbeddedBroker, sim, tmp: Path, rounds: int) -> dict:
    """The interleaved ratio when 10% of the records are resends of already-ingested payments (each
    round into its own copy of the store that holds them)."""
    kafka, history_root, resent = _resend_topic(broker, sim, tmp, spark)

    def store_for_round(i: int) -> Path:
        root = tmp / f"resend-raw-{i}"
        shutil.copytree(history_root, root)
        return root

    runs = _interleaved(spark, kafka, tmp, rounds, store_for_round)
    assert all(r["duplicates"] == resent for r in runs), (resent, [r["duplicates"] for r in runs])
    ratios = [round(r["ratio"], 3) for r in runs]
    median = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
    return {"ratio_with_resends": round(statistics.median(r["ratio"] for r in runs), 3),
            "ratio_with_resends_runs": ratios, "resends": resent, "resend_share": RESEND_SHARE,
            "resend_rows": median["rows"], "resend_ingest_s": round(median["ingest_s"], 2),
            "resend_stages": {s.name: s.seconds for s in median["stages"]}}


def _measure(broker: EmbeddedBroker, kafka: KafkaConfig, tmp: Path, sim, rounds: int) -> dict:
    spark_config = bench_ingest_config(tmp / "raw").spark
    started = time.perf_counter()
    spark = build_spark_session(spark_config)
    spark_start_s = time.perf_counter() - started
    try:
        warmup_s = _warm_up(spark, broker, tmp, sim)
        with PeakRss() as rss:
            runs = _interleaved(spark, kafka, tmp, rounds)
        resends = _with_resends(spark, broker, sim, tmp, rounds)
        publish_records(kafka, kafka.labels_topic, Kind.LABEL, sim.label_records())
        config = bench_ingest_config(tmp / "raw-0")
        run_raw_ingest(config, kafka, spark=spark, progress=quiet())
        features_rows, features_cold_s, features_s = _time_features(spark, RawStore(config.raw.root()), config)
    finally:
        spark.stop()
    median = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
    ratios = [round(r["ratio"], 3) for r in runs]
    baseline_rps = median["baseline_rows"] / median["baseline_s"]
    return {"rows": median["rows"], "ingest_s": round(median["ingest_s"], 2),
            "ingest_rows_per_s": round(median["rows"] / median["ingest_s"]),
            "baseline_rows": median["baseline_rows"], "baseline_s": round(median["baseline_s"], 2),
            "baseline_rows_per_s": round(baseline_rps), "ratio": round(statistics.median(r["ratio"] for r in runs), 3),
            "ratio_runs": ratios, "ratio_spread": round(max(ratios) - min(ratios), 3),
            "peak_rss_mb": round(rss.peak_mb), "spark_start_s": round(spark_start_s, 2),
            "warmup_s": round(warmup_s, 2), "stages": {s.name: s.seconds for s in median["stages"]},
            "master": spark_config.master, "features_rows": features_rows, "features_s": round(features_s, 2),
            "features_s_per_million": round(features_s / (features_rows / 1e6), 2),
            "features_cold_s": round(features_cold_s, 2),
            "features_cold_s_per_million": round(features_cold_s / (features_rows / 1e6), 2), **resends,
            "ratio_with_resends_vs_ratio": round(resends["ratio_with_resends"] / statistics.median(
                r["ratio"] for r in runs), 3)}


def run(quick: bool) -> dict:
    sim = _simulation(quick)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker("127.0.0.1", free_port(), Path(tmp) / "b.log") as broker:
        broker.start()
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers, transactions_topic="bench-transactions",
                            labels_topic="bench-labels", partitions=PARTITIONS)
        broker.create_topics(kafka.topics(), PARTITIONS)
        report = publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records())
        assert report.ok, report.errors
        result = _measure(broker, kafka, Path(tmp), sim, ROUNDS)
        id_check = _time_id_check(Path(tmp), night_rows=50_000 if quick else 200_000)
    return {**result, **_time_online(sim, measured=5_000 if quick else 20_000), **id_check, "rounds": ROUNDS,
            "partitions": PARTITIONS}


ID_CHECK_NIGHTS = (30, 90)


def _night_ids(night: int, rows: int) -> pa.Array:
    return pa.array([f"h-{night}-{i}" for i in range(rows)], pa.string())


def _history_index(root: Path, nights: int, night_rows: int) -> IdIndex:
    """``nights`` committed nights of ``night_rows`` payments each, in the segment layout that as many
    commits leave (:func:`pipeline.ingest.id_index.counter_layout`), written straight away."""
    live: list[str] = []
    for segment in counter_layout(nights):
        first, last = segment_span(segment)
        parts = []
        for night in range(first, last + 1):
            ids = transaction_id_hashes(_night_ids(night, night_rows))
            n = len(ids)
            parts.append(Entries(ids, ids["h1"] ^ np.uint64(0x5A5A), np.full(n, night, np.int32),
                                 np.full(n, night, np.int32)))
        live = IdIndex(root, live).with_segment(segment, Entries.concat(parts))
    return IdIndex(root, live)


def _one_night(nights: int, night_rows: int, rng: np.random.Generator) -> pa.Table:
    """One night's transaction ids: 90% new, 10% resends drawn uniformly over the whole history."""
    resends = int(night_rows * RESEND_SHARE)
    ids = [f"new-{i}" for i in range(night_rows - resends)]
    ids += [f"h-{n}-{i}" for n, i in zip(rng.integers(0, nights, resends), rng.integers(0, night_rows, resends),
                                         strict=True)]
    n = len(ids)
    return pa.table({"transaction_id": pa.array(ids, pa.string()),
                     ARRIVAL: pa.array(np.arange(n), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                     "partition": pa.array(np.zeros(n, np.int32)), "offset": pa.array(np.arange(n))})


def _time_id_check(tmp: Path, night_rows: int, repeats: int = 5) -> dict:
    """Seconds of the identity check for one night (hash its ids, look them up in the index, classify
    copies) against 30 and 90 nights of history; the median of ``repeats``, page cache warm (the
    index was just written), as on a nightly host that keeps it hot."""
    rng = np.random.default_rng(5)
    out: dict = {"id_check_night_rows": night_rows, "id_check_s": {}, "id_check_index_entries": {}}
    for nights in ID_CHECK_NIGHTS:
        index = _history_index(tmp / f"id-index-{nights}", nights, night_rows)
        night = _one_night(nights, night_rows, rng)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            ids = transaction_id_hashes(night["transaction_id"])
            stored = index.lookup(ids)
            copies = classify_copies(ids, arrival_order(night[ARRIVAL]), night["partition"].to_numpy(),
                                     night["offset"].to_numpy(), ids["h1"] ^ np.uint64(0x5A5A), stored)
            seconds.append(time.perf_counter() - started)
        assert copies.count(DUPLICATE) == int(night_rows * RESEND_SHARE), copies.count(DUPLICATE)
        out["id_check_s"][str(nights)] = round(statistics.median(seconds), 4)
        out["id_check_index_entries"][str(nights)] = nights * night_rows
        shutil.rmtree(tmp / f"id-index-{nights}")
    first, last = (out["id_check_s"][str(n)] for n in ID_CHECK_NIGHTS)
    out["id_check_90_vs_30"] = round(last / first, 3)
    return out


def _time_features(spark, store: RawStore, config: IngestConfig) -> tuple[int, float, float]:
    """(rows, first seconds, second seconds) to compute every feature of every ingested transaction
    (Spark's no-op sink). The first build also starts the Python workers of the kernel's passes (as a
    nightly job does once); the second is the feature stage itself."""
    tx = read_raw_table(spark, store, Kind.TRANSACTION).cache()
    labels = read_raw_table(spark, store, Kind.LABEL).cache()
    rows = tx.count()  # materialise the inputs: time the features, not the Parquet scan
    labels.count()
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        build_features(tx, labels, config.features).write.format("noop").mode("overwrite").save()
        seconds.append(time.perf_counter() - started)
    tx.unpersist()
    labels.unpersist()
    return rows, seconds[0], seconds[1]


def _time_online(sim, measured: int) -> dict:
    """Per-payment cost of the online kernel on the simulation: replay everything (fraud reports as
    they arrive), time the last ``measured`` payments with the online bench's own :func:`time_payment`."""
    tx = sim.transactions
    payments = sorted((Payment(*row) for row in zip(
        tx["transaction_id"], tx["card_id"], tx["merchant_id"], epoch_micros(tx["event_time"]).tolist(), tx["amount"],
        tx["mcc"], tx["channel"], tx["country"], strict=True)), key=lambda p: p.ts_us)
    labels = sim.labels
    reports = sorted(zip(labels["transaction_id"], labels["is_fraud"], epoch_micros(labels["reported_at"]).tolist(), strict=True),
                     key=lambda r: r[2])
    state = OnlineFeatureState(IngestConfig().features)
    timings, next_report = [], 0
    for i, payment in enumerate(payments):
        while next_report < len(reports) and reports[next_report][2] <= payment.ts_us:
            state.observe_label(*reports[next_report])
            next_report += 1
        if i >= len(payments) - measured:
            timings.append(time_payment(state, payment)[0])
        else:
            state.observe_payment(payment)
    p50, p99 = percentiles(timings)
    return {"replay_feature_us_p50": p50, "replay_feature_us_p99": p99, "replay_measured": len(timings)}
