"""Offset planning from committed offsets and watermarks, and the atomic commit log."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contract import Kind
from pipeline.ingest.id_index import INDEX_DIR, INDEX_FORMAT
from pipeline.ingest.identity import transaction_id_hashes
from pipeline.ingest.index_build import build_missing_index
from pipeline.ingest.offsets import OffsetGapError, OffsetRange, OffsetStore, plan_offset_ranges
from pipeline.ingest.raw_commit import commit_raw_run
from pipeline.ingest.raw_layout import RawStore
from tests.ingest.kafka_helpers import small_simulation


def test_plan_starts_at_committed_and_ends_at_the_high_watermark():
    plan = plan_offset_ranges("t", {0: 10, 1: 5}, {0: (0, 25), 1: (0, 5), 2: (3, 9)})
    assert plan.ranges == (OffsetRange("t", 0, 10, 25), OffsetRange("t", 1, 5, 5), OffsetRange("t", 2, 3, 9))
    assert plan.records == 15 + 0 + 6  # a never-committed partition starts at its low watermark
    assert plan.next_offsets() == {0: 25, 1: 5, 2: 9}
    assert plan.lost == {}


def test_retention_gap_is_an_error_naming_the_lost_offsets():
    with pytest.raises(OffsetGapError, match=r"t\[0\]: records 10\.\.19 were deleted.*--allow-data-loss"):
        plan_offset_ranges("t", {0: 10}, {0: (20, 30)})


def test_allow_data_loss_restarts_at_low_and_records_the_loss():
    plan = plan_offset_ranges("t", {0: 10}, {0: (20, 30)}, allow_data_loss=True)
    assert plan.ranges == (OffsetRange("t", 0, 20, 30),)
    assert plan.lost == {0: 10}


def test_committed_beyond_the_end_or_vanished_partitions_are_errors():
    with pytest.raises(OffsetGapError, match="beyond the end"):
        plan_offset_ranges("t", {0: 50}, {0: (0, 30)})
    with pytest.raises(OffsetGapError, match=r"no longer has partitions \[3\]"):
        plan_offset_ranges("t", {3: 1}, {0: (0, 30)})


def test_commit_log_advances_offsets_keeps_first_offsets_and_only_raises_watermarks(tmp_path):
    store = OffsetStore(tmp_path)
    assert store.load().runs == ()
    first = plan_offset_ranges("t", {}, {0: (0, 10), 1: (0, 4)})
    store.commit("run-1", [first], {"t": {0: 500, 1: 900}})
    second = plan_offset_ranges("t", store.load().offsets["t"], {0: (0, 15), 1: (0, 4)})
    state = store.commit("run-2", [second], {"t": {0: 700, 1: 100}})
    assert state.runs == ("run-1", "run-2")
    assert state.offsets == {"t": {0: 15, 1: 4}}
    assert state.watermarks == {"t": {0: 700, 1: 900}}
    assert state.consumed_ranges() == {"t": {"0": [0, 15], "1": [0, 4]}}
    assert store.load() == state  # what is on disk
    assert not list((tmp_path / "_state").glob(".*tmp*"))  # the temp file was renamed away
    assert json.loads(store.path.read_text())["runs"] == ["run-1", "run-2"]


def test_the_commit_log_records_the_index_format_and_drops_an_index_of_another(tmp_path):
    offsets = OffsetStore(tmp_path)
    offsets.commit("run-0", [], index={"transactions": ["000000-000000"]})
    written = json.loads(offsets.path.read_text())
    assert written["index_format"] == INDEX_FORMAT and offsets.load().index == {"transactions": ["000000-000000"]}
    for old in ({k: v for k, v in written.items() if k != "index_format"}, {**written, "index_format": 1}):
        offsets.path.write_text(json.dumps(old))  # a store written by the 64-bit version
        assert offsets.load().index is None and offsets.load().runs == ("run-0",)


def test_a_store_with_a_64_bit_index_gets_a_new_one_built_and_its_old_segments_removed(tmp_path):
    sim = small_simulation(days=3, num_cards=100)
    tx = sim.transactions
    store = RawStore(tmp_path / "raw")
    commit_raw_run(store, "night-0", tx.iloc[: len(tx) // 2], sim.labels.iloc[:0])
    commit_raw_run(store, "night-1", tx.iloc[len(tx) // 2:], sim.labels.iloc[:0])
    # Rewind to what the 64-bit version left: no format in the commit log, (3, n) buckets.
    legacy = json.loads(store.offsets.path.read_text())
    legacy.pop("index_format")
    store.offsets.path.write_text(json.dumps(legacy))
    old_segments = [p for p in (store.root / INDEX_DIR).glob("*/*") if p.is_dir()]
    for bucket in (b for s in old_segments for b in s.iterdir()):
        np.save(bucket, np.zeros((3, 1), np.uint64))

    assert store.committed().index is None  # never read as the new format
    removed = store.discard_uncommitted()
    assert set(old_segments) <= set(removed)
    built = build_missing_index(store)
    assert built is not None and store.committed().index == built
    found = store.id_index(Kind.TRANSACTION).lookup(transaction_id_hashes(pa.array(tx["transaction_id"])))
    assert found.found.all()
    assert not store.id_index(Kind.TRANSACTION).lookup(transaction_id_hashes(pa.array(["never-sent"]))).found.any()
