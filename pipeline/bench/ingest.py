"""Ingest throughput: our Spark ingest into the raw store vs one Python Kafka reader.

Same topic, measured in one run: >= 500k simulated transactions (quick: 60k) in 4 partitions of
an embedded broker started on a free port. (a) baseline: one confluent-kafka consumer drains the
topic and ``json.loads`` each value in this process, the practical limit of one reader here;
(b) ours: :func:`pipeline.ingest.job.run_raw_ingest`, Kafka read on executors, validation,
duplicate and timing screens, Parquet raw store and quarantine, accounting and commit. The Spark
session is started and warmed (one small ingest into a separate store, so the executors' Python
workers exist) before the clock; both start-up costs are reported (``spark_start_s``,
``warmup_s``). Then the feature build over the ingested rows is timed (``features_s_per_million``).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import threading
import time
from pathlib import Path

import psutil
from confluent_kafka import Consumer, TopicPartition

from pipeline.contract import Kind
from pipeline.features.transforms import build_features
from pipeline.ingest.config import IngestConfig, SparkConfig
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.progress import Progress, quiet
from pipeline.ingest.raw_store import RawStore
from pipeline.ingest.session import build_spark_session
from pipeline.kafka.admin import end_offsets
from pipeline.kafka.broker import EmbeddedBroker, free_port
from pipeline.kafka.producer import publish_records
from pipeline.kafka.settings import KafkaConfig
from pipeline.simulation import SimulationConfig, simulate

PARTITIONS = 4


class PeakRss:
    """Peak resident memory of this process and all its children (JVM, Python workers), sampled."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)

    def _sample(self, interval_s: float) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak_mb = max(self.peak_mb, total / 2**20)
            self._stop.wait(interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


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


def _config(raw_root: Path) -> IngestConfig:
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
    run_raw_ingest(_config(tmp / "warmup-raw"), kafka, spark=spark, progress=quiet())
    return time.perf_counter() - started


def _measure_ours(broker: EmbeddedBroker, kafka: KafkaConfig, tmp: Path, sim) -> dict:
    """Warm session, timed raw ingest of the topic, then the timed feature build."""
    config = _config(tmp / "raw")
    started = time.perf_counter()
    spark = build_spark_session(config.spark)
    spark_start_s = time.perf_counter() - started
    try:
        warmup_s = _warm_up(spark, broker, tmp, sim)
        with PeakRss() as rss:
            started = time.perf_counter()
            ingest = run_raw_ingest(config, kafka, spark=spark, progress=Progress(emit=print, prefix="[bench]"))
            ingest_s = time.perf_counter() - started
        publish_records(kafka, kafka.labels_topic, Kind.LABEL, sim.label_records())
        run_raw_ingest(config, kafka, spark=spark, progress=quiet())
        features_s = _time_features(spark, RawStore(config.raw.root()), config)
    finally:
        spark.stop()
    rows = ingest.accounting[0].read
    return {"rows": rows, "ingest_s": round(ingest_s, 2), "ingest_rows_per_s": round(rows / ingest_s),
            "peak_rss_mb": round(rss.peak_mb), "spark_start_s": round(spark_start_s, 2), "warmup_s": round(warmup_s, 2),
            "features_s_per_million": round(features_s / (rows / 1e6), 2),
            "stages": {s.name: s.seconds for s in ingest.stages}, "master": config.spark.master}


def run(quick: bool) -> dict:
    sim = _simulation(quick)
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker("127.0.0.1", free_port(), Path(tmp) / "b.log") as broker:
        broker.start()
        kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers, transactions_topic="bench-transactions",
                            labels_topic="bench-labels", partitions=PARTITIONS)
        broker.create_topics(kafka.topics(), PARTITIONS)
        report = publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records())
        assert report.ok, report.errors
        baseline_rows, baseline_s = baseline_drain(kafka, kafka.transactions_topic)
        ours = _measure_ours(broker, kafka, Path(tmp), sim)
    baseline_rps = baseline_rows / baseline_s
    return {**ours, "baseline_rows": baseline_rows, "baseline_s": round(baseline_s, 2),
            "baseline_rows_per_s": round(baseline_rps), "ratio": round(ours["ingest_rows_per_s"] / baseline_rps, 3),
            "partitions": PARTITIONS}


def _time_features(spark, store: RawStore, config: IngestConfig) -> float:
    """Seconds to compute every feature of every ingested transaction (written to Spark's no-op sink)."""
    tx = store.read(spark, Kind.TRANSACTION)
    labels = store.read(spark, Kind.LABEL)
    started = time.perf_counter()
    build_features(tx, labels, config.features).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started
