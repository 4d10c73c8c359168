"""Offset planning from committed offsets and watermarks, and the atomic commit log."""

from __future__ import annotations

import json

import pytest

from pipeline.ingest.offsets import OffsetGapError, OffsetRange, OffsetStore, plan_offset_ranges


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
