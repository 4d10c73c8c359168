"""Copies within one run, settled on the driver from the hashes the read tasks wrote: the right copy
stays, the others move with a detail naming the first, and landed rows are read back only where a
copy was found."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from pipeline.contract import Kind
from pipeline.ingest import run_copies
from pipeline.ingest.accounting import CopyMoves
from pipeline.ingest.classify import classify_batch
from pipeline.ingest.id_index import IdIndex
from pipeline.ingest.identity import content_hashes, identity_hashes
from pipeline.ingest.kafka_source import ARROW_SCHEMA
from pipeline.ingest.landing import land_stream, landing_transform
from pipeline.ingest.raw_layout import QUARANTINE, RUN_HASHES, RawStore
from pipeline.ingest.run_copies import RunHashesMismatch, settle_copies
from pipeline.ingest.timing import TimingRules
from pipeline.ingest.validate import DETAIL, REASON
from tests.ingest.corpus import tx

RUN = "run-1"
RUN_STARTED_US = int(datetime(2024, 3, 10, tzinfo=UTC).timestamp() * 1_000_000)
RULES = TimingRules(max_lateness_days=7, max_clock_skew_s=300, run_started_us=RUN_STARTED_US)
LATE_TIME = "2024-03-01T12:00:00.000Z"  # more than 7 days behind the partition's newest payments
NEW_TIME = "2024-03-09T12:00:00.000Z"


def land_task(root: Path, partition: int, values: list[bytes], kafka_us: list[int]) -> None:
    """One read task's landing of ``values`` at offsets 0.. of ``partition``, arriving ``kafka_us``
    after an hour before the run started."""
    n = len(values)
    kafka_us = [RUN_STARTED_US - 3_600_000_000 + us for us in kafka_us]
    batch = pa.RecordBatch.from_pydict({
        "topic": ["t"] * n, "partition": pa.array([partition] * n, pa.int32()), "offset": pa.array(range(n), pa.int64()),
        "timestamp": pa.array(kafka_us, pa.int64()).cast(ARROW_SCHEMA.field("timestamp").type),
        "key": pa.array([b"k"] * n, pa.binary()), "value": pa.array(values, pa.binary())}, schema=ARROW_SCHEMA)
    args = landing_transform(Kind.TRANSACTION, RULES, RUN, root, IdIndex(root / "_index", []), [], True).args
    assert len(list(land_stream(iter([batch]), args))) == 1


def table(root: Path, subdir: str) -> pa.Table:
    return ds.dataset(str(root / subdir), format="parquet", partitioning="hive").to_table()


def identity(values: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    typed = classify_batch(pa.RecordBatch.from_pydict({
        "topic": ["t"] * len(values), "partition": pa.array([0] * len(values), pa.int32()),
        "offset": pa.array(range(len(values)), pa.int64()),
        "timestamp": pa.nulls(len(values), ARROW_SCHEMA.field("timestamp").type),
        "key": pa.array([b"k"] * len(values), pa.binary()), "value": pa.array(values, pa.binary())},
        schema=ARROW_SCHEMA), Kind.TRANSACTION, None, None)
    return identity_hashes(typed, Kind.TRANSACTION), content_hashes(typed, Kind.TRANSACTION)


def test_copies_across_read_tasks_keep_the_earliest_and_name_it(tmp_path):
    a1, a2 = tx(transaction_id="t-1", event_time=NEW_TIME), tx(transaction_id="t-2", event_time=NEW_TIME)
    b2 = tx(transaction_id="t-2", event_time=NEW_TIME, amount=99.0)  # another version, first to arrive
    late_copy = tx(transaction_id="t-1", event_time=LATE_TIME)  # conflicting (other time), and late
    land_task(tmp_path, 0, [a1, a2, tx(transaction_id="t-3", event_time=NEW_TIME)], [10, 10, 10])
    land_task(tmp_path, 1, [b2, tx(transaction_id="t-4", event_time=NEW_TIME), a1, late_copy], [5, 5, 20, 30])

    settled = settle_copies(RawStore(tmp_path), Kind.TRANSACTION, RUN, 7, quarantine_identical=True)

    assert settled.moves == CopyMoves(valid_to_duplicate=1, valid_to_conflicting=1, late_to_conflicting=1)
    raw = table(tmp_path, "transactions").sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert list(zip(raw["partition"].to_pylist(), raw["transaction_id"].to_pylist(), strict=True)) == [
        (0, "t-1"), (0, "t-3"), (1, "t-2"), (1, "t-4")]
    quarantine = table(tmp_path, QUARANTINE).sort_by([("partition", "ascending"), ("offset", "ascending")])
    moved = {(p, o): (r, d) for p, o, r, d in zip(*(quarantine[c].to_pylist() for c in
                                                     ("partition", "offset", REASON, DETAIL)), strict=True)}
    assert moved == {
        (0, 1): ("conflicting_duplicate", "a different version of this event came first in this run at partition 1 "
                                          "offset 0 (kept)"),
        (1, 2): ("duplicate", "an identical copy of this event came first in this run at partition 0 offset 0 (kept)"),
        (1, 3): ("conflicting_duplicate", "a different version of this event came first in this run at partition 0 "
                                          "offset 0 (kept)")}
    # The index entries are the rows that stayed valid: their identities, contents and days.
    ids, contents = identity([a1, tx(transaction_id="t-3", event_time=NEW_TIME), b2,
                              tx(transaction_id="t-4", event_time=NEW_TIME)])
    order = np.argsort(settled.kept.ids, order=("h1", "h2"))
    expected = np.argsort(ids, order=("h1", "h2"))
    assert settled.kept.ids[order].tolist() == ids[expected].tolist()
    assert settled.kept.contents[order].tolist() == contents[expected].tolist()
    assert set(settled.kept.days.tolist()) == {(datetime(2024, 3, 9) - datetime(1970, 1, 1)).days}
    assert set(settled.kept.runs.tolist()) == {7}


def test_a_run_without_copies_reads_no_landed_row_back(tmp_path, monkeypatch):
    land_task(tmp_path, 0, [tx(transaction_id=f"t-{i}", event_time=NEW_TIME) for i in range(5)], [1] * 5)
    land_task(tmp_path, 1, [tx(transaction_id=f"u-{i}", event_time=NEW_TIME) for i in range(5)]
              + [tx(transaction_id="u-late", event_time=LATE_TIME)], [1] * 6)
    read = []
    real_read_table = run_copies.pq.read_table
    monkeypatch.setattr(run_copies.pq, "read_table", lambda path, *a, **k: read.append(Path(path)) or
                        real_read_table(path, *a, **k))

    settled = settle_copies(RawStore(tmp_path), Kind.TRANSACTION, RUN, 0, quarantine_identical=True)

    assert settled.moves == CopyMoves() and len(settled.kept.ids) == 10
    assert read and all(p.is_relative_to(tmp_path / RUN_HASHES) for p in read)


def test_hashes_that_do_not_match_the_landed_files_stop_the_run(tmp_path):
    land_task(tmp_path, 0, [tx(transaction_id="t-1", event_time=NEW_TIME)], [1])
    land_task(tmp_path, 1, [tx(transaction_id="t-2", event_time=NEW_TIME)], [1])
    next((tmp_path / "transactions").glob("*/*/part-t-00001-*.parquet")).unlink()
    with pytest.raises(RunHashesMismatch, match="not committed; rerun it"):
        settle_copies(RawStore(tmp_path), Kind.TRANSACTION, RUN, 0, quarantine_identical=True)


def test_an_uncommitted_runs_hashes_are_discarded_with_its_files(tmp_path):
    land_task(tmp_path, 0, [tx(transaction_id="t-1", event_time=NEW_TIME)], [1])
    store = RawStore(tmp_path)
    assert store.run_hash_files(RUN, Kind.TRANSACTION)
    store.discard_uncommitted()
    assert not store.run_hash_files(RUN, Kind.TRANSACTION) and not list((tmp_path / "transactions").glob("*/*"))
