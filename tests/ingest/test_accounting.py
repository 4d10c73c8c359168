"""Accounting: the sums must add up, and must match what the run's files hold."""

from __future__ import annotations

import pytest

from pipeline.ingest.accounting import AccountingError, CopyMoves, account, merge_summaries, verify_landed
from pipeline.ingest.landing import ChunkSummary
from pipeline.ingest.offsets import OffsetPlan, OffsetRange

PLAN = OffsetPlan("tx", (OffsetRange("tx", 0, 0, 100), OffsetRange("tx", 1, 10, 60)))


def dups(n: int) -> CopyMoves:
    return CopyMoves(valid_to_duplicate=n)


def test_merges_chunks_and_moves_duplicates_out_of_valid():
    chunks = [ChunkSummary("tx", 0, 0, 49, 50, {"valid": 48, "malformed_json": 2}, 700, {}),
              ChunkSummary("tx", 0, 50, 99, 50, {"valid": 50}, 900, {}),
              ChunkSummary("tx", 1, 10, 59, 50, {"valid": 49, "late_event": 1}, None, {})]
    read, outcomes, watermarks = merge_summaries(chunks)
    assert read == {0: 100, 1: 50}
    assert outcomes == {None: 147, "malformed_json": 2, "late_event": 1}
    assert watermarks == {0: 900}
    a = account(PLAN, "transaction", read, outcomes, dups(3))
    assert (a.read, a.valid, a.duplicates, a.quarantined_total, a.offset_span) == (150, 144, 3, 3, 150)
    assert a.read == a.valid + a.quarantined_total + a.duplicates
    assert a.to_dict()["ranges"] == {"0": [0, 100], "1": [10, 60]}


def test_inconsistent_counts_are_refused():
    with pytest.raises(AccountingError, match="read but 99 outcomes"):
        account(PLAN, "transaction", {0: 100}, {None: 99})
    with pytest.raises(AccountingError, match="read twice"):
        account(PLAN, "transaction", {1: 51}, {None: 51})
    with pytest.raises(AccountingError, match="more copies"):
        account(PLAN, "transaction", {0: 5}, {None: 2, "bad_mcc": 3}, dups(3))
    with pytest.raises(AccountingError, match="more copies"):  # only late records can turn from late to copies
        account(PLAN, "transaction", {0: 5}, {None: 4, "late_event": 1}, CopyMoves(late_to_duplicate=2))
    with pytest.raises(AccountingError, match="unknown outcome"):
        account(PLAN, "transaction", {0: 5}, {"mystery": 5})


def test_a_failed_check_says_it_is_a_bug_to_report_not_a_reason_to_rerun():
    with pytest.raises(AccountingError) as failed:
        account(PLAN, "transaction", {0: 100}, {None: 99})
    assert "report it" in str(failed.value) and "a rerun will fail the same way" in str(failed.value)
    assert "rerun the job" not in str(failed.value)


def test_copies_move_from_valid_and_late_into_duplicates_and_the_conflicting_reason():
    moves = CopyMoves(valid_to_duplicate=5, valid_to_conflicting=2, late_to_duplicate=3, late_to_conflicting=1)
    a = account(PLAN, "transaction", {0: 40}, {None: 30, "late_event": 6, "bad_mcc": 4}, moves)
    assert (a.valid, a.duplicates) == (23, 8)
    assert a.quarantined == {"bad_mcc": 4, "conflicting_duplicate": 3, "late_event": 2}
    assert a.read == a.valid + a.quarantined_total + a.duplicates
    verify_landed(a, raw_rows=23, quarantine_rows=9 + 8)  # identical copies kept in the quarantine
    verify_landed(a, raw_rows=23, quarantine_rows=9, duplicates_quarantined=False)  # or only counted
    with pytest.raises(AccountingError, match="expected 23 and 9"):
        verify_landed(a, raw_rows=23, quarantine_rows=17, duplicates_quarantined=False)


def test_all_late_copies_leave_no_late_reason_behind():
    a = account(PLAN, "transaction", {0: 10}, {None: 7, "late_event": 3}, CopyMoves(late_to_duplicate=3))
    assert a.quarantined == {} and (a.valid, a.duplicates) == (7, 3)


def test_copies_the_read_tasks_refused_add_to_those_found_within_the_run():
    a = account(PLAN, "transaction", {0: 10},
                {None: 5, "duplicate": 2, "conflicting_duplicate": 1, "late_event": 2}, dups(1))
    assert (a.valid, a.duplicates) == (4, 3)
    assert a.quarantined == {"conflicting_duplicate": 1, "late_event": 2}
    assert a.read == a.valid + a.duplicates + a.quarantined_total


def test_files_must_hold_exactly_the_accounted_rows():
    a = account(PLAN, "transaction", {0: 10}, {None: 8, "bad_mcc": 2}, dups(1))
    verify_landed(a, raw_rows=7, quarantine_rows=3)
    with pytest.raises(AccountingError, match="expected 7 and 3"):
        verify_landed(a, raw_rows=8, quarantine_rows=3)


LABELS = OffsetPlan("labels", (OffsetRange("labels", 0, 0, 20),))


def test_orphan_labels_are_counted_among_the_valid_ones():
    a = account(LABELS, "label", {0: 20}, {None: 18, "wrong_type": 2}, dups(3), orphan_labels=4)
    # Orphans stay in the raw store: the identity holds without them, and the files hold `valid` rows.
    assert (a.read, a.valid, a.quarantined_total, a.duplicates, a.orphan_labels) == (20, 15, 2, 3, 4)
    assert a.read == a.valid + a.quarantined_total + a.duplicates
    assert a.to_dict()["orphan_labels"] == 4
    verify_landed(a, raw_rows=15, quarantine_rows=5)


def test_orphans_beyond_the_kept_labels_or_on_transactions_are_refused():
    with pytest.raises(AccountingError, match="16 orphan labels among 15 valid"):
        account(LABELS, "label", {0: 20}, {None: 18, "wrong_type": 2}, dups(3), orphan_labels=16)
    with pytest.raises(AccountingError, match="only kept labels can be orphans"):
        account(PLAN, "transaction", {0: 10}, {None: 10}, orphan_labels=1)
