"""The ingest job end to end on the real broker and Spark: accounting, raw store, dataset, reruns,
and datasets too small to publish."""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from pipeline.contract import Kind
from pipeline.datasets.manifest import ID_COLUMNS, LABEL_COLUMN, REPORTED_AT_COLUMN, load_manifest
from pipeline.features.definitions import FEATURE_COLUMNS
from pipeline.ingest.config import SplitMinimums, load_ingest_config
from pipeline.ingest.dataset_plan import DatasetTooSmall
from pipeline.ingest.job import failure_message, run_backfill, run_nightly
from pipeline.ingest.progress import quiet
from pipeline.ingest.raw_layout import RawStore
from pipeline.kafka.producer import dumps_event, publish_records
from tests.ingest.kafka_helpers import event_bytes, produce, small_simulation

pytestmark = [pytest.mark.broker, pytest.mark.spark]
RUN_DATE = date(2026, 1, 30)
NOW_MS = int(datetime.now(UTC).timestamp() * 1000)


def bad_transactions(sim) -> list[tuple[str | None, bytes | None, bytes | None, int | None]]:
    """(expected reason, key, value, partition) for one record of every kind of trouble."""
    base = sim.transaction_records().__next__()
    good = {**base, "event_time": sim.transactions["event_time"].iloc[-1]}

    def variant(tag: str, **changes) -> bytes:
        return event_bytes({**good, "transaction_id": f"bad-{tag}", **changes})

    missing = {k: v for k, v in good.items() if k != "currency"}
    future = (datetime.now(UTC) + timedelta(days=2)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return [
        ("malformed_json", b"k", b'{"schema_version": 1, "transaction_id": ', None),
        ("malformed_json", b"k", None, None),  # a tombstone: no value at all
        ("not_an_object", b"k", b"[1, 2, 3]", None),
        ("missing_field", b"k", event_bytes({**missing, "transaction_id": "bad-missing"}), None),
        ("wrong_type", b"k", variant("type", amount="12.50"), None),
        ("unknown_schema_version", b"k", variant("v9", schema_version=9), None),
        ("empty_id", b"k", variant("empty", card_id="  "), None),
        ("negative_amount", b"k", variant("neg", amount=-5), None),
        ("non_finite_amount", b"k", json.dumps({**good, "transaction_id": "bad-nan", "amount": float("nan")}).encode(), None),
        ("bad_currency", b"k", variant("cur", currency="EURO"), None),
        ("bad_time", b"k", variant("time", event_time="2026-02-30T10:00:00Z"), None),
        ("bad_mcc", b"k", variant("mcc", mcc="54a1"), None),
        ("bad_country", b"k", variant("country", country="Germany"), None),
        ("future_event_time", b"k", variant("future", event_time=future), None),
        ("late_event", b"k", variant("late", event_time="2025-12-01T00:00:00.000Z"), 0),  # weeks behind partition 0
        (None, b"k", variant("unicode-ok", event_time="2026-01-30T12:00:00+01:00", device_id="Gerät"), None),
    ]


def publish_sim(kafka, sim, duplicates: int = 3) -> list[tuple]:
    assert publish_records(kafka, kafka.transactions_topic, Kind.TRANSACTION, sim.transaction_records()).ok
    assert publish_records(kafka, kafka.labels_topic, Kind.LABEL, sim.label_records()).ok
    bad = bad_transactions(sim)
    for _, key, value, partition in bad:
        produce(kafka, kafka.transactions_topic, [(key, value, NOW_MS)], partition=partition)
    # Producer retries: the same bytes again, keyed as the originals (same partition).
    resend = list(sim.transaction_records())[-duplicates:]
    produce(kafka, kafka.transactions_topic, [(r["card_id"].encode(), dumps_event(r).encode(), None) for r in resend])
    label = list(sim.label_records())[-1]  # the latest report: a re-send of an early one would be late
    produce(kafka, kafka.labels_topic, [(label["transaction_id"].encode(), dumps_event(label).encode(), None),
                                        (b"x", b'{"schema_version": 1, "transaction_id": "t", "is_fraud": "yes", '
                                               b'"reported_at": "2026-01-05T00:00:00Z"}', None)])
    return bad


@pytest.fixture(scope="module")
def sim():
    return small_simulation(days=30, num_cards=150)


def ingest_config(**dataset):
    """conf/dev with 2 shuffle partitions; no protocol gap unless ``dataset`` sets one (a month of data)."""
    config = load_ingest_config("dev")
    return dataclasses.replace(config, spark=dataclasses.replace(config.spark, shuffle_partitions=2),
                               dataset=dataclasses.replace(config.dataset, **({"gap_days": 0} | dataset)))


def raw_table(store: RawStore, kind: Kind):
    return pads.dataset([str(f) for f in store.committed_files(kind)], format="parquet").to_table()


@pytest.mark.slow
def test_nightly_accounts_for_every_record_and_publishes_the_dataset(spark, state_dir, kafka_config, sim):
    bad = publish_sim(kafka_config, sim)
    config = ingest_config()
    report = run_nightly(config, kafka_config, RUN_DATE, spark=spark, progress=quiet())

    tx, labels = report.accounting
    expected_reasons = Counter(r for r, *_ in bad if r is not None)
    assert tx.read == len(sim.transactions) + len(bad) + 3 == tx.offset_span
    assert tx.quarantined == dict(expected_reasons)
    assert (tx.duplicates, tx.valid) == (3, len(sim.transactions) + 1)
    assert (labels.read, labels.valid, labels.duplicates, labels.quarantined) == (
        len(sim.labels) + 2, len(sim.labels), 1, {"wrong_type": 1})

    store = RawStore(config.raw.root())
    raw = raw_table(store, Kind.TRANSACTION)
    ids = raw["transaction_id"].to_pylist()
    assert len(ids) == len(set(ids)) and set(ids) == set(sim.transactions["transaction_id"]) | {"bad-unicode-ok"}
    quarantine = pads.dataset(str(store.root / "quarantine"), format="parquet").to_table().to_pandas()
    # Every Kafka position of the run is in exactly one place: the raw store or the quarantine.
    positions = Counter(zip(raw["partition"].to_pylist(), raw["offset"].to_pylist(), strict=True))
    tx_q = quarantine[quarantine["kind"] == "transaction"]
    positions.update(zip(tx_q["partition"], tx_q["offset"], strict=True))
    assert max(positions.values()) == 1
    assert set(positions) == {(int(p), o) for p, (s, e) in tx.ranges.items() for o in range(s, e)}
    truncated = tx_q[tx_q["reject_reason"] == "malformed_json"]["value"].dropna().tolist()
    assert truncated == [b'{"schema_version": 1, "transaction_id": ']  # raw bytes kept
    assert set(tx_q[tx_q["reject_reason"] == "duplicate"]["value"].map(lambda v: json.loads(v)["transaction_id"])) \
        == set(sim.transactions["transaction_id"].iloc[-3:])

    manifest = load_manifest(config.dataset.dataset_root())
    assert report.dataset.version == manifest.version and manifest.content_hash in manifest.version + manifest.content_hash
    dates = {s.date for s in manifest.shards}
    assert len(dates) == 20 and len(manifest.shards) == 20 * 8
    assert manifest.splits["test"].end == "2026-01-23" and manifest.label_cutoff == "2026-01-30"
    assert manifest.kafka_offsets == store.committed().consumed_ranges()
    root = config.dataset.dataset_root()
    frames = []
    for shard in manifest.shards:
        assert shard.path.startswith(f"data/{manifest.version}/date={shard.date}/shard-")
        table = pq.read_table(root / shard.path)
        assert table.column_names == [*ID_COLUMNS, *FEATURE_COLUMNS, LABEL_COLUMN, REPORTED_AT_COLUMN]
        assert table.num_rows == shard.rows and sum(table[LABEL_COLUMN].to_pylist()) == shard.frauds
        assert all(zlib.crc32(t.encode()) % 8 == shard.shard for t in table["transaction_id"].to_pylist())
        frames.append(table.to_pandas())
    rows = pd.concat(frames)
    window = sim.transactions[(sim.transactions["event_time"] >= "2026-01-04")
                              & (sim.transactions["event_time"] < "2026-01-24")]
    assert sorted(rows["transaction_id"]) == sorted(window["transaction_id"])
    reported = sim.labels[sim.labels["reported_at"] < "2026-01-31"]
    latest = reported.sort_values(["reported_at", "is_fraud"]).groupby("transaction_id")["is_fraud"].last()
    expected_label = window["transaction_id"].map(latest).fillna(False).astype(int)
    assert rows.set_index("transaction_id")["label"].sort_index().tolist() == \
        expected_label.set_axis(window["transaction_id"]).sort_index().tolist()

    # Rerun: nothing new in Kafka -> nothing read, the same bytes, no new rows.
    again = run_nightly(config, kafka_config, RUN_DATE, spark=spark, progress=quiet())
    assert [a.read for a in again.accounting] == [0, 0]
    assert again.dataset.content_hash == report.dataset.content_hash and again.dataset.reused
    assert raw_table(store, Kind.TRANSACTION).num_rows == len(ids)

    # Later records: the same payments re-sent (duplicates of stored rows) and new ones.
    later = small_simulation(days=2, num_cards=150, start_date="2026-01-31")
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION,
                           list(sim.transaction_records())[-5:] + list(later.transaction_records())).ok
    third = run_nightly(config, kafka_config, date(2026, 2, 1), spark=spark, progress=quiet())
    assert (third.accounting[0].duplicates, third.accounting[0].valid) == (5, len(later.transactions))
    assert raw_table(store, Kind.TRANSACTION).num_rows == len(ids) + len(later.transactions)
    by_date = store.committed_rows_by_date(Kind.TRANSACTION, date(2026, 1, 31), date(2026, 2, 1))  # the later days
    assert sum(by_date.values()) == len(later.transactions) and set(by_date) == {date(2026, 1, 31), date(2026, 2, 1)}
    assert load_manifest(root).label_cutoff == "2026-02-01"

    # A run date whose windows lie past the data: refused before publication, LATEST stays.
    published = sorted(p.name for p in (root / "manifests").iterdir())
    with pytest.raises(DatasetTooSmall) as refused:
        run_nightly(config, kafka_config, date(2026, 3, 30), spark=spark, progress=quiet())
    assert "train 2026-03-04..2026-03-17 has 0 rows at most" in str(refused.value)  # before any feature
    assert "transactions end on 2026-02-01" in str(refused.value)
    assert failure_message(refused.value).startswith("DatasetTooSmall: dataset for label cutoff 2026-03-30")
    assert (root / "LATEST").read_text().strip() == third.dataset.version
    assert sorted(p.name for p in (root / "manifests").iterdir()) == published
    assert sorted(p.name for p in (root / "data").iterdir()) == sorted(
        {third.dataset.version, report.dataset.version})  # no build directory or version left behind


def test_backfill_rebuilds_a_range_from_the_raw_store_identically(spark, state_dir, kafka_config, sim):
    assert publish_records(kafka_config, kafka_config.transactions_topic, Kind.TRANSACTION, sim.transaction_records()).ok
    assert publish_records(kafka_config, kafka_config.labels_topic, Kind.LABEL, sim.label_records()).ok
    config = ingest_config()
    first = run_backfill(config, kafka_config, date(2025, 12, 31), date(2026, 1, 19), from_kafka=True, spark=spark,
                         progress=quiet())
    assert first.accounting[0].valid == len(sim.transactions)
    assert first.dataset.label_cutoff == "2026-01-26"  # 7 days of maturity after the range
    train, test = first.dataset.splits["train"], first.dataset.splits["test"]
    assert (train["start"], train["end"], test["end"]) == ("2025-12-31", "2026-01-13", "2026-01-19")  # train_days 14
    again = run_backfill(config, None, date(2025, 12, 31), date(2026, 1, 19), spark=spark, progress=quiet())
    assert again.accounting == () and again.dataset.content_hash == first.dataset.content_hash


def test_with_a_gap_training_labels_are_those_known_at_the_gap_end_and_test_labels_at_the_cutoff(
        spark, state_dir, kafka_config, sim):
    publish_sim(kafka_config, sim)
    config = ingest_config(train_days=10, validation_days=2, gap_days=7, test_days=3,
                           min_rows=SplitMinimums(train=1, validation=1, test=1),
                           min_frauds=SplitMinimums(train=0, validation=0, test=0))
    report = run_nightly(config, kafka_config, RUN_DATE, spark=spark, progress=quiet())
    manifest = load_manifest(config.dataset.dataset_root())
    assert {k: (w.start, w.end) for k, w in manifest.splits.items()} == {
        "train": ("2026-01-02", "2026-01-11"), "validation": ("2026-01-12", "2026-01-13"),
        "gap": ("2026-01-14", "2026-01-20"), "test": ("2026-01-21", "2026-01-23")}
    assert report.dataset.label_cutoff == "2026-01-30"
    root = config.dataset.dataset_root()
    rows = pd.concat(pq.read_table(root / s.path).to_pandas() for s in manifest.shards).set_index("transaction_id")
    assert rows[REPORTED_AT_COLUMN].notna().sum() > 0
    # Frauds reported between the gap's end and the cutoff: fraud in the data, not yet in training labels.
    late = sim.labels[sim.labels["is_fraud"] & (sim.labels["reported_at"] >= "2026-01-21")
                      & (sim.labels["reported_at"] < "2026-01-31")]["transaction_id"]
    assert rows.index.isin(late).any()

    def labels_known_before(instant: str) -> pd.Series:
        reported = sim.labels[sim.labels["reported_at"] < instant]
        return reported.sort_values(["reported_at", "is_fraud"]).groupby("transaction_id")["is_fraud"].last()

    day = pd.to_datetime(rows["event_time"]).dt.strftime("%Y-%m-%d")
    for split, known_before in (("train", "2026-01-21"), ("validation", "2026-01-21"), ("gap", "2026-01-31"),
                                ("test", "2026-01-31")):
        window = manifest.splits[split]
        part = rows[(day >= window.start) & (day <= window.end)]
        expected = part.index.map(labels_known_before(known_before)).fillna(False).astype(int)
        assert part["label"].tolist() == list(expected), split
    frauds = sim.labels[sim.labels["is_fraud"] & (sim.labels["reported_at"] < "2026-01-31")]
    first_report = frauds.groupby("transaction_id")["reported_at"].min()
    expected_first = pd.to_datetime(first_report[first_report.index.isin(rows.index)], utc=True)
    assert rows[REPORTED_AT_COLUMN].dropna().to_dict() == expected_first.to_dict()
