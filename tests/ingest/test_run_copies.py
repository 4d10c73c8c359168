"""Copies of stored events and within one run, settled on the driver from the hashes the read tasks
wrote: the right copy stays, the others move with a detail naming the first (in the store or in the
run), and landed rows are read back only where a copy was found."""

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
from pipeline.ingest.id_index import Entries
from pipeline.ingest.identity import content_hashes, identity_hashes
from pipeline.ingest.kafka_source import ARROW_SCHEMA
from pipeline.ingest.landing import land_stream, landing_transform
from pipeline.ingest.offsets import OffsetPlan
from pipeline.ingest.raw_layout import QUARANTINE, RUN_HASHES, TABLE_BY_KIND, RawStore
from pipeline.ingest.run_copies import RunHashesMismatch, settle_copies
from pipeline.ingest.timing import TimingRules
from pipeline.ingest.validate import DETAIL, FIELD, REASON
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
    args = landing_transform(Kind.TRANSACTION, RULES, RUN, root, True).args
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


STORED_DAY = (datetime(2024, 3, 9) - datetime(1970, 1, 1)).days


def commit_stored(root: Path, ids: np.ndarray, contents: np.ndarray) -> RawStore:
    """A store whose one committed run, "run-0", entered ``ids`` in the identity index on STORED_DAY."""
    store = RawStore(root)
    n = len(ids)
    entries = Entries(ids, contents, np.full(n, STORED_DAY, np.int32), np.zeros(n, np.int32))
    segments = store.id_index(Kind.TRANSACTION).with_run(0, entries)
    store.offsets.commit("run-0", [OffsetPlan("t", ())], index={TABLE_BY_KIND[Kind.TRANSACTION]: segments})
    return store


@pytest.mark.parametrize("quarantine_identical", [True, False])
def test_copies_of_stored_events_leave_the_run_valid_or_late_with_the_stored_place(tmp_path, quarantine_identical):
    stored_late, stored_new = tx(transaction_id="t-s", event_time=LATE_TIME), tx(transaction_id="t-old", event_time=NEW_TIME)
    store = commit_stored(tmp_path, *identity([stored_late, stored_new]))
    land_task(tmp_path, 0, [tx(transaction_id="t-new", event_time=NEW_TIME),
                            stored_late,  # identical to the stored one, and late
                            tx(transaction_id="t-old", event_time=NEW_TIME, amount=1.5),  # another version, valid
                            tx(transaction_id="t-late", event_time=LATE_TIME)], [1, 2, 3, 4])  # late, not a copy

    settled = settle_copies(store, Kind.TRANSACTION, RUN, 1, quarantine_identical)

    assert settled.moves == CopyMoves(valid_to_conflicting=1, late_to_duplicate=1)
    assert table(tmp_path, "transactions")["transaction_id"].to_pylist() == ["t-new"]
    quarantine = table(tmp_path, QUARANTINE).to_pandas().set_index("transaction_id")
    assert set(quarantine.index) == ({"t-s"} if quarantine_identical else set()) | {"t-old", "t-late"}
    assert quarantine.loc["t-old", REASON] == "conflicting_duplicate"
    assert quarantine.loc["t-old", DETAIL] == ("a different version of this event is in the raw store: "
                                               "transactions/event_date=2024-03-09/run_id=run-0")
    assert quarantine.loc["t-old", FIELD] == "transaction_id"
    assert quarantine.loc["t-late", REASON] == "late_event"
    if quarantine_identical:
        assert quarantine.loc["t-s", REASON] == "duplicate"
        assert quarantine.loc["t-s", DETAIL] == ("an identical copy of this event is in the raw store: "
                                                 "transactions/event_date=2024-03-09/run_id=run-0")
        assert quarantine.loc["t-s", "id_hash"] != 0  # copies stay findable by identity
    assert len(settled.kept.ids) == 1 and set(settled.kept.runs.tolist()) == {1}


def test_an_event_whose_first_64_identity_bits_match_a_stored_one_is_kept(tmp_path):
    # A 64-bit identity collision, made by hand: the index holds "t-stored" under the first half of
    # "t-new"'s identity. With 64-bit identities "t-new" was quarantined as a conflicting duplicate
    # of "t-stored"; the second half tells them apart.
    new_tx, stored_tx = tx(transaction_id="t-new", event_time=NEW_TIME), tx(transaction_id="t-stored", event_time=NEW_TIME)
    ids, contents = identity([stored_tx, new_tx])
    ids["h1"][0] = ids["h1"][1]  # "t-stored" entered under "t-new"'s first 64 bits
    store = commit_stored(tmp_path, ids[:1], contents[:1])
    land_task(tmp_path, 0, [new_tx], [1])

    settled = settle_copies(store, Kind.TRANSACTION, RUN, 1, quarantine_identical=True)

    assert settled.moves == CopyMoves() and len(settled.kept.ids) == 1
    assert table(tmp_path, "transactions")["transaction_id"].to_pylist() == ["t-new"]
