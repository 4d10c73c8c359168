"""Kafka -> Spark DataFrame of raw records ``(topic, partition, offset, timestamp, key, value)``.

Default: :class:`KafkaBatchSource`, a PySpark (4.x) Python data source. The driver plans one
input partition per topic-partition offset range (split into chunks of at most
``max_records_per_split``); each executor task assigns itself that partition with confluent-kafka
(no consumer group, nothing committed to Kafka), reads exactly ``[start, end)`` and yields Arrow
record batches, so no per-row Python objects cross into the JVM. The tasks' librdkafka lines go
to the run log of the run that reads (:mod:`pipeline.ingest.run_log`), not to the console.

``format = "kafka"`` uses Spark's built-in source instead. It needs the spark-sql-kafka jar on the
classpath (``spark-submit --packages org.apache.spark:spark-sql-kafka-0-10_2.13:<version>``), which
this build environment cannot download, so that branch is only a thin mapping to the same columns.
"""

from __future__ import annotations

import bisect
import importlib
import itertools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from pipeline.ingest.config import SourceConfig
from pipeline.ingest.offsets import OffsetRange
from pipeline.ingest.run_log import ACTIVE_RUN_LOG, route_task_logs
from pipeline.kafka.settings import KafkaConfig, with_log_routing

SOURCE_NAME = "fraud_kafka"
RECORD_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value")
RECORD_SCHEMA = "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"
ARROW_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("key", pa.binary()), ("value", pa.binary()),
])


class KafkaReadError(RuntimeError):
    """A read task could not deliver its whole offset range; the message names partition and offset."""


@dataclass(frozen=True)
class BatchTransform:
    """A function the read task applies to its record batches before they leave Python.

    ``function`` is ``"module:name"`` of ``f(batches: Iterator[RecordBatch], args: dict) ->
    Iterator[RecordBatch]``; ``schema`` is the DDL of what it yields. Saves a JVM<->Python round
    trip compared with ``mapInArrow`` on the read.
    """

    function: str
    args: dict
    schema: str

    def resolve(self) -> Callable[[Iterator[pa.RecordBatch], dict], Iterator[pa.RecordBatch]]:
        module, name = self.function.split(":")
        return getattr(importlib.import_module(module), name)


def split_range(r: OffsetRange, max_records: int) -> list[OffsetRange]:
    """``r`` cut into consecutive chunks of at most ``max_records`` offsets (none if empty)."""
    return [OffsetRange(r.topic, r.partition, s, min(s + max_records, r.end))
            for s in range(r.start, r.end, max_records)]


class _RangeReader:
    """One consumer assigned to one offset range (no group membership, nothing committed)."""

    def __init__(self, client: dict, r: OffsetRange, stall_timeout_s: float, allow_data_loss: bool) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.r, self.stall_timeout_s, self.allow_data_loss = r, stall_timeout_s, allow_data_loss
        self.consumer = Consumer(with_log_routing({
            **client, "group.id": "fraud-ingest-reader", "enable.auto.commit": False,
            "auto.offset.reset": "earliest" if allow_data_loss else "error", "enable.partition.eof": True}))
        self.consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        self.expected = r.start  # next offset wanted
        self.last_progress = time.monotonic()

    def poll(self, fetch_batch: int) -> pa.RecordBatch | None:
        """The next batch of records inside the range, or None when this poll brought none."""
        from confluent_kafka import KafkaError

        r = self.r
        # Ask for no more than the range still holds: consume() returns as soon as that many arrived.
        messages = self.consumer.consume(num_messages=min(fetch_batch, r.end - self.expected), timeout=1.0)
        records = []
        for msg in messages:
            err = msg.error()
            if err is None:
                records.append(msg)
            elif err.code() != KafkaError._PARTITION_EOF:
                raise KafkaReadError(f"{r.topic}[{r.partition}] read failed near offset {self.expected}: {err}")
        offsets = [m.offset() for m in records]
        if offsets and offsets[-1] >= r.end:  # the fetch ran past the range: keep only what is inside
            keep = bisect.bisect_left(offsets, r.end)
            records, offsets, self.expected = records[:keep], offsets[:keep], r.end
        if not offsets:
            return None
        if offsets[0] > self.expected == r.start and not self.allow_data_loss:
            raise KafkaReadError(f"{r.topic}[{r.partition}]: offsets {r.start}..{offsets[0] - 1} are gone "
                                 f"(deleted by retention after planning); rerun, or --allow-data-loss")
        self.expected = max(self.expected, offsets[-1] + 1)
        self.last_progress = time.monotonic()
        return _batch(r, offsets, [m.timestamp() for m in records], [m.key() for m in records],
                      [m.value() for m in records])

    def finished(self) -> bool:
        """The range is done: its last offset was read, or the consumer's position passed the end
        (offsets inside a range may be missing on compacted or transactional topics)."""
        from confluent_kafka import OFFSET_END, TopicPartition

        if self.expected >= self.r.end:
            return True
        position = self.consumer.position([TopicPartition(self.r.topic, self.r.partition, OFFSET_END)])[0].offset
        if position >= self.r.end:
            return True
        if time.monotonic() - self.last_progress > self.stall_timeout_s:
            raise KafkaReadError(f"{self.r.topic}[{self.r.partition}] stalled at offset {self.expected} (range ends "
                                 f"at {self.r.end}) for {self.stall_timeout_s:.0f}s; is the broker reachable?")
        return False


def read_range(client: dict, r: OffsetRange, fetch_batch: int, stall_timeout_s: float,
               allow_data_loss: bool = False) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``r`` as Arrow batches of the ``ARROW_SCHEMA``, in offset order.

    Raises :class:`KafkaReadError` if records at the start have been deleted (unless
    ``allow_data_loss``) or if the partition yields nothing for ``stall_timeout_s``.
    """
    reader = _RangeReader(client, r, stall_timeout_s, allow_data_loss)
    try:
        while True:
            batch = reader.poll(fetch_batch)
            if batch is not None:
                yield batch
            elif reader.finished():
                return
            if reader.expected >= r.end:
                return
    finally:
        reader.consumer.close()


def _batch(r: OffsetRange, offsets: list, stamps: list[tuple[int, int]], keys: list, values: list) -> pa.RecordBatch:
    """``stamps``: librdkafka's ``(type, ms)`` per record; no timestamp (type 0, or ms < 0) is null."""
    n = len(offsets)
    # Flattened, not np.array(stamps): converting a list of tuples costs about 3x more per record.
    typed_ms = np.fromiter(itertools.chain.from_iterable(stamps), np.int64, 2 * n).reshape(n, 2)
    missing = (typed_ms[:, 0] == 0) | (typed_ms[:, 1] < 0)
    return pa.RecordBatch.from_arrays([
        pa.repeat(r.topic, n),
        pa.repeat(pa.scalar(r.partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(typed_ms[:, 1] * 1000, pa.int64(), mask=missing).cast(pa.timestamp("us", tz="UTC")),
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
    ], schema=ARROW_SCHEMA)


class KafkaRangePartition(InputPartition):
    """One Spark task's share: an offset range of one topic partition."""

    def __init__(self, r: OffsetRange) -> None:
        super().__init__(r)
        self.range = r


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        self.client = json.loads(options["client"])
        self.ranges = [OffsetRange(**d) for d in json.loads(options["ranges"])]
        self.max_records = int(options["max_records_per_split"])
        self.fetch_batch = int(options["fetch_batch"])
        self.stall_timeout_s = float(options["stall_timeout_s"])
        self.allow_data_loss = options["allow_data_loss"] == "true"
        transform = options.get("transform")
        self.transform = BatchTransform(**json.loads(transform)) if transform else None
        self.log_file, self.log_level = options.get("log_file"), options.get("log_level", "INFO")

    def partitions(self) -> list[InputPartition]:
        chunks = [c for r in self.ranges for c in split_range(r, self.max_records)]
        # Spark needs at least one partition; an empty read still plans a task that yields nothing.
        return [KafkaRangePartition(c) for c in chunks] or [KafkaRangePartition(OffsetRange("", 0, 0, 0))]

    def read(self, partition: KafkaRangePartition) -> Iterator[pa.RecordBatch]:
        if partition.range.count == 0:
            return iter(())
        if self.log_file:
            route_task_logs(self.log_file, self.log_level)
        batches = read_range(self.client, partition.range, self.fetch_batch, self.stall_timeout_s,
                             self.allow_data_loss)
        return self.transform.resolve()(batches, self.transform.args) if self.transform else batches


class KafkaBatchSource(DataSource):
    """``spark.read.format("fraud_kafka")``: options ``client`` (JSON librdkafka settings), ``ranges``
    (JSON list of OffsetRange fields), ``max_records_per_split``, ``fetch_batch``, ``stall_timeout_s``,
    ``allow_data_loss`` and optionally ``transform`` (JSON :class:`BatchTransform`), ``log_file`` and
    ``log_level`` (where the tasks' librdkafka lines go)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        transform = self.options.get("transform")
        return json.loads(transform)["schema"] if transform else RECORD_SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return KafkaBatchReader(self.options)


def read_kafka(spark: SparkSession, kafka: KafkaConfig, ranges: list[OffsetRange], source: SourceConfig,
               allow_data_loss: bool = False, transform: BatchTransform | None = None) -> DataFrame:
    """The records of ``ranges`` as a DataFrame with ``RECORD_COLUMNS`` (one scan; cache it if reused).

    With ``transform``, the frame holds what the transform yields instead: applied in the read task
    on the Python source, with ``mapInArrow`` after Spark's built-in source. Inside a run
    (:data:`pipeline.ingest.run_log.ACTIVE_RUN_LOG`), the read tasks log to that run's log.
    """
    if source.format == "kafka":
        records = _read_builtin(spark, kafka, ranges, allow_data_loss)
        if transform is None:
            return records
        function, args = transform.resolve(), transform.args
        return records.mapInArrow(lambda batches: function(batches, args), transform.schema)
    spark.dataSource.register(KafkaBatchSource)
    reader = spark.read.format(SOURCE_NAME)
    if transform is not None:
        reader = reader.option("transform", json.dumps(transform.__dict__))
    run_log = ACTIVE_RUN_LOG.get()
    if run_log is not None:
        reader = reader.option("log_file", str(run_log.path)).option("log_level", run_log.level)
    return (reader
            .option("client", json.dumps(kafka.confluent()))
            .option("ranges", json.dumps([r.__dict__ for r in ranges if r.count > 0]))
            .option("max_records_per_split", str(source.max_records_per_split))
            .option("fetch_batch", str(source.fetch_batch))
            .option("stall_timeout_s", str(source.stall_timeout_s))
            .option("allow_data_loss", "true" if allow_data_loss else "false")
            .load())


def _read_builtin(spark: SparkSession, kafka: KafkaConfig, ranges: list[OffsetRange],
                  allow_data_loss: bool) -> DataFrame:
    """Spark's own ``kafka`` source over the same ranges (requires the spark-sql-kafka jar)."""
    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return spark.createDataFrame([], RECORD_SCHEMA)
    starts, ends = {}, {}
    for r in ranges:
        starts.setdefault(r.topic, {})[str(r.partition)] = r.start
        ends.setdefault(r.topic, {})[str(r.partition)] = r.end
    reader = (spark.read.format("kafka")
              .option("assign", json.dumps({t: sorted(int(p) for p in ps) for t, ps in starts.items()}))
              .option("startingOffsets", json.dumps(starts))
              .option("endingOffsets", json.dumps(ends))
              .option("failOnDataLoss", "false" if allow_data_loss else "true"))
    for key, value in java_client_options(kafka).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load().select("topic", F.col("partition").cast("int"), "offset", "timestamp", "key", "value")


def java_client_options(kafka: KafkaConfig) -> dict[str, str]:
    """The Java Kafka client's names for the settings ``KafkaConfig.confluent()`` gives librdkafka."""
    opts = {"bootstrap.servers": kafka.bootstrap_servers, "security.protocol": kafka.security_protocol}
    if kafka.sasl_mechanism:
        opts["sasl.mechanism"] = kafka.sasl_mechanism
        module = ("org.apache.kafka.common.security.scram.ScramLoginModule" if "SCRAM" in kafka.sasl_mechanism
                  else "org.apache.kafka.common.security.plain.PlainLoginModule")
        opts["sasl.jaas.config"] = (f'{module} required username="{kafka.sasl_username or ""}" '
                                    f'password="{kafka.sasl_password or ""}";')
    if kafka.ssl_cafile:
        opts["ssl.truststore.type"] = "PEM"
        opts["ssl.truststore.location"] = kafka.ssl_cafile
    return opts
