"""Landing inside a read task: what the raw store and the quarantine receive, byte for byte."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from pipeline.contract import Kind, validate_event
from pipeline.ingest.kafka_source import ARROW_SCHEMA
from pipeline.ingest.landing import land_stream, landing_transform, parse_summaries
from pipeline.ingest.raw_layout import PAYLOAD, QUARANTINE
from pipeline.ingest.timing import TimingRules
from pipeline.ingest.validate import DETAIL, FIELD, REASON
from tests.ingest.corpus import GOOD_LABEL, GOOD_TX, label, tx

RUN_STARTED_US = int(datetime(2024, 3, 10, tzinfo=UTC).timestamp() * 1_000_000)
RULES = TimingRules(max_lateness_days=7, max_clock_skew_s=300, run_started_us=RUN_STARTED_US)


def records(values: list[bytes | None], topic: str = "t") -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "topic": [topic] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.nulls(n, ARROW_SCHEMA.field("timestamp").type), "key": pa.array([b"k"] * n, pa.binary()),
        "value": pa.array(values, pa.binary())}, schema=ARROW_SCHEMA)


def land(values: list[bytes | None], kind: Kind, root: Path, quarantine_duplicates: bool = True) -> dict:
    args = landing_transform(kind, RULES, "run-1", root, quarantine_duplicates).args
    summaries = parse_summaries([b.to_pylist()[0] for b in land_stream(iter([records(values)]), args)])
    assert len(summaries) == 1
    return summaries[0].outcomes


def table(root: Path, subdir: str) -> pa.Table:
    return ds.dataset(str(root / subdir), format="parquet", partitioning="hive").to_table().sort_by("offset")


def test_quarantine_keeps_the_bytes_as_read_and_the_contract_detail(tmp_path):
    values = [
        tx(),
        tx()[:-1] + b', "note": "\xff\xfe"}',  # not UTF-8, in an otherwise valid transaction
        tx().replace(b'"d-1"', b'"d-\xc3"'),
        b"\xff\xfe{}",
        None,  # a tombstone
        tx(device_id="\ud800"),
        tx(amount=-1),
        tx(amount=0),  # a card verification: valid
    ]
    outcomes = land(values, Kind.TRANSACTION, tmp_path)
    assert outcomes == {"valid": 2, "malformed_json": 5, "negative_amount": 1}

    quarantine = table(tmp_path, QUARANTINE)
    refused = [1, 2, 3, 4, 5, 6]
    assert quarantine["offset"].to_pylist() == refused
    assert quarantine["value"].to_pylist() == [values[i] for i in refused]
    contract = [validate_event(values[i] if values[i] is not None else b"", Kind.TRANSACTION)[1] for i in refused]
    assert quarantine[REASON].to_pylist() == [r.reason.value for r in contract]
    assert quarantine[FIELD].to_pylist() == [r.field for r in contract]
    assert quarantine[DETAIL].to_pylist() == [r.detail for r in contract]
    assert "can't decode byte 0xff" in quarantine[DETAIL][0].as_py()

    raw = table(tmp_path, "transactions")
    assert raw["offset"].to_pylist() == [0, 7]
    assert [p.encode() for p in raw[PAYLOAD].to_pylist()] == [values[0], values[7]]
    assert raw["amount"].to_pylist() == [GOOD_TX["amount"], 0.0]


def test_late_transactions_are_quarantined_with_the_rule_but_late_labels_land(tmp_path):
    eight_days_later = "2024-03-09T12:00:00.000Z"  # than GOOD_TX's event time
    tx_outcomes = land([tx(event_time=eight_days_later), tx(transaction_id="t-old")], Kind.TRANSACTION, tmp_path)
    assert tx_outcomes == {"valid": 1, "late_event": 1}
    late = table(tmp_path, QUARANTINE).filter(pa.compute.equal(pa.compute.field("kind"), "transaction"))
    assert late[DETAIL].to_pylist() == ["event_time is more than 7 days behind its partition's watermark "
                                        "(the latest accepted event_time at earlier offsets)"]

    newer = label(transaction_id="t-new", reported_at="2024-03-09T00:00:00Z")
    months_older = label(reported_at="2023-12-01T00:00:00Z")
    assert land([newer, months_older, label()], Kind.LABEL, tmp_path) == {"valid": 3}
    landed = table(tmp_path, "labels")
    assert landed["transaction_id"].to_pylist() == ["t-new", GOOD_LABEL["transaction_id"],
                                                    GOOD_LABEL["transaction_id"]]
    assert [json.loads(p)["reported_at"] for p in landed[PAYLOAD].to_pylist()] == [
        "2024-03-09T00:00:00Z", "2023-12-01T00:00:00Z", GOOD_LABEL["reported_at"]]
