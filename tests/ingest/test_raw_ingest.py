"""Kafka -> raw store on the real broker and Spark: late labels land, orphan labels are counted,
the quarantine keeps the reject detail and the bytes as read."""

from __future__ import annotations

import dataclasses
import threading
import time

import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
from rich.console import Console

from pipeline.contract import Kind, validate_event
from pipeline.ingest import raw_ingest
from pipeline.ingest.accounting import AccountingError
from pipeline.ingest.config import load_ingest_config
from pipeline.ingest.job import run_raw_ingest
from pipeline.ingest.progress import Progress, print_summary
from pipeline.ingest.raw_layout import QUARANTINE, RawStore
from pipeline.ingest.validate import DETAIL, REASON
from tests.ingest.corpus import label, tx
from tests.ingest.kafka_helpers import produce

pytestmark = [pytest.mark.broker, pytest.mark.spark]


def config():
    c = load_ingest_config("dev")
    return dataclasses.replace(c, spark=dataclasses.replace(c.spark, shuffle_partitions=2))


def send(kafka, topic: str, values: list[bytes]) -> None:
    # One partition, in this order: the watermark of each record is that of the ones before it.
    produce(kafka, topic, [(b"k", v, None) for v in values], partition=0)


@pytest.mark.slow
def test_late_labels_land_orphans_are_counted_and_the_quarantine_is_faithful(spark, state_dir, kafka_config):
    not_utf8 = tx(transaction_id="t-bytes")[:-1] + b', "note": "caf\xe9"}'  # Latin-1, not UTF-8
    send(kafka_config, kafka_config.transactions_topic, [
        tx(transaction_id="t-a", event_time="2026-01-10T10:00:00Z"),
        tx(transaction_id="t-b", event_time="2026-01-20T10:00:00Z"),
        tx(transaction_id="t-late", event_time="2026-01-01T10:00:00Z"),  # 19 days behind: late
        tx(transaction_id="t-zero", event_time="2026-01-20T11:00:00Z", amount=0),  # card verification
        not_utf8,
        tx(transaction_id="t-neg", event_time="2026-01-20T12:00:00Z", amount=-4.5),
    ])
    send(kafka_config, kafka_config.labels_topic, [
        label(transaction_id="t-b", reported_at="2026-01-28T09:00:00Z"),
        label(transaction_id="t-a", reported_at="2026-01-12T09:00:00Z"),  # 16 days behind the one before
        label(transaction_id="t-never", reported_at="2026-01-28T10:00:00Z"),  # no such payment (yet)
        label(transaction_id="t-late", reported_at="2026-01-05T09:00:00Z"),  # its payment was quarantined
    ])
    lines: list[str] = []
    report = run_raw_ingest(config(), kafka_config, spark=spark, progress=Progress(emit=lines.append))

    tx_acc, labels = report.accounting
    assert (tx_acc.read, tx_acc.valid, tx_acc.duplicates) == (6, 3, 0)
    assert tx_acc.quarantined == {"late_event": 1, "malformed_json": 1, "negative_amount": 1}
    assert (labels.read, labels.valid, labels.quarantined, labels.orphan_labels) == (4, 4, {}, 2)
    assert any("orphan_labels=2" in line for line in lines)
    console = Console(record=True, width=250)
    print_summary(report, console)
    label_row = next(r for r in console.export_text().splitlines() if kafka_config.labels_topic in r)
    assert label_row.split("│")[-2].strip() == "2"  # the "orphan labels" column

    store = RawStore(config().raw.root())
    stored = pads.dataset([str(f) for f in store.committed_files(Kind.LABEL)], format="parquet").to_table()
    assert sorted(stored["transaction_id"].to_pylist()) == ["t-a", "t-b", "t-late", "t-never"]
    quarantine = pads.dataset(str(store.root / QUARANTINE), format="parquet").to_table()
    refused = quarantine.filter(pc.equal(quarantine[REASON], "malformed_json"))
    assert refused["value"].to_pylist() == [not_utf8]
    assert refused[DETAIL].to_pylist() == [validate_event(not_utf8, Kind.TRANSACTION)[1].detail]
    late = quarantine.filter(pc.equal(quarantine[REASON], "late_event"))
    assert late[DETAIL][0].as_py().startswith("event_time is more than 7 days behind")

    # The missing payment arrives on a later night: its label, stored last night, is no orphan now.
    send(kafka_config, kafka_config.transactions_topic, [tx(transaction_id="t-never", event_time="2026-01-21T10:00:00Z")])
    send(kafka_config, kafka_config.labels_topic, [label(transaction_id="t-never", is_fraud=False,
                                                         reported_at="2026-02-02T10:00:00Z")])
    again = run_raw_ingest(config(), kafka_config, spark=spark, progress=Progress(emit=lines.append))
    assert [(a.valid, a.orphan_labels) for a in again.accounting] == [(1, 0), (1, 0)]


def test_labels_are_read_while_transactions_are_checked_and_a_failed_check_commits_nothing(
        spark, state_dir, kafka_config, monkeypatch):
    send(kafka_config, kafka_config.transactions_topic,
         [tx(transaction_id=f"t-{i}", event_time="2026-01-20T10:00:00Z") for i in range(3)])
    send(kafka_config, kafka_config.labels_topic, [label(transaction_id="t-1", reported_at="2026-01-21T09:00:00Z")])
    lines: list[str] = []
    seen_during_check: list[bool] = []
    real_settle_copies = raw_ingest.settle_copies

    def check_waiting_for_the_labels(store, kind, run_id, *args):
        if kind is Kind.TRANSACTION:  # the labels' read must finish while this check still runs
            deadline = time.monotonic() + 60
            while not any("labels: read + validate + land" in line for line in lines) and time.monotonic() < deadline:
                time.sleep(0.05)
            seen_during_check.append(any("labels: read + validate + land" in line for line in lines))
            raise AccountingError("injected: the transactions' check failed")
        return real_settle_copies(store, kind, run_id, *args)

    monkeypatch.setattr(raw_ingest, "settle_copies", check_waiting_for_the_labels)
    with pytest.raises(AccountingError, match="injected"):
        run_raw_ingest(config(), kafka_config, spark=spark, progress=Progress(emit=lines.append))
    assert seen_during_check == [True]
    assert not [t for t in threading.enumerate() if t.name.startswith("land-labels")]  # joined, not left running
    store = RawStore(config().raw.root())
    assert store.committed().runs == ()
    assert store.committed_files(Kind.TRANSACTION) == [] and store.committed_files(Kind.LABEL) == []

    monkeypatch.setattr(raw_ingest, "settle_copies", real_settle_copies)
    report = run_raw_ingest(config(), kafka_config, spark=spark, progress=Progress(emit=lines.append))
    assert [(a.read, a.valid, a.duplicates) for a in report.accounting] == [(3, 3, 0), (1, 1, 0)]
    assert len(store.committed_files(Kind.LABEL)) >= 1
