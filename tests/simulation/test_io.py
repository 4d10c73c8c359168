"""Event files: simulated data round-trips through JSONL and Parquet; bad lines are named by line."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract import Kind, RejectReason
from pipeline.simulation import SimulationConfig, simulate
from pipeline.simulation.io import (
    EventFileError,
    read_event_lines,
    scan_events,
    write_rejects,
    write_simulation,
)

TINY = SimulationConfig(seed=3, start_date="2026-02-01", days=2, num_cards=300, num_merchants=200,
                        fraud_rate=0.02)


@pytest.fixture(scope="module")
def sim():
    return simulate(TINY)


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_written_files_read_back_as_the_same_valid_records(sim, tmp_path: Path, fmt: str) -> None:
    paths = write_simulation(sim, tmp_path, fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"labels.{fmt}", f"transactions.{fmt}"]
    tx_scan = scan_events(read_event_lines(paths["transactions"]))
    label_scan = scan_events(read_event_lines(paths["labels"]))
    assert not tx_scan.rejected and not label_scan.rejected
    assert [e.record for e in tx_scan.valid] == list(sim.transaction_records())
    assert [e.record for e in label_scan.valid] == list(sim.label_records())
    assert {e.kind for e in tx_scan.valid} == {Kind.TRANSACTION}
    assert {e.kind for e in label_scan.valid} == {Kind.LABEL}
    assert [e.line_no for e in tx_scan.valid[:3]] == [1, 2, 3]


def test_bad_lines_are_rejected_with_line_numbers_and_reasons(sim, tmp_path: Path) -> None:
    tx = next(sim.transaction_records())
    label = next(sim.label_records())
    lines = [
        json.dumps(tx).encode(),  # 1 valid transaction
        b"{not json",  # 2
        b"[1, 2]",  # 3
        json.dumps({**tx, "amount": -5}).encode(),  # 4
        b"",  # 5 blank: skipped, not an error
        json.dumps({k: v for k, v in tx.items() if k != "card_id"}).encode(),  # 6 card_id missing
        json.dumps(label).encode(),  # 7 valid label
        json.dumps({**label, "reported_at": "2026-01-01 10:00"}).encode(),  # 8 no offset
        json.dumps({"schema_version": 1, "hello": "world"}).encode(),  # 9 neither kind
        b'{"schema_version": 1, "card_id": "\xff\xfe"}',  # 10 not UTF-8
        json.dumps({**tx, "schema_version": 2}).encode(),  # 11
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    scan = scan_events(read_event_lines(path))
    assert [(e.line_no, e.kind) for e in scan.valid] == [(1, Kind.TRANSACTION), (7, Kind.LABEL)]
    got = {r.line_no: (r.rejection.reason, r.rejection.field) for r in scan.rejected}
    assert got == {
        2: (RejectReason.MALFORMED_JSON, None),
        3: (RejectReason.NOT_AN_OBJECT, None),
        4: (RejectReason.NEGATIVE_AMOUNT, "amount"),
        6: (RejectReason.MISSING_FIELD, "card_id"),
        8: (RejectReason.BAD_TIME, "reported_at"),
        9: (RejectReason.MISSING_FIELD, None),
        10: (RejectReason.MALFORMED_JSON, None),
        11: (RejectReason.UNKNOWN_SCHEMA_VERSION, "schema_version"),
    }
    assert scan.reject_counts()["malformed_json"] == 2

    rejects = tmp_path / "r.jsonl"
    assert write_rejects(scan.rejected, rejects) == 8
    first = json.loads(rejects.read_text().splitlines()[0])
    assert first == {"line": 2, "reason": "malformed_json", "field": None, "detail": first["detail"],
                     "raw": "{not json"}


def _with_amount(record: dict, literal: str) -> bytes:
    """``record`` as a JSON line whose amount is ``literal``, a number ``json.dumps`` would not write."""
    return json.dumps({**record, "amount": "AMOUNT"}).replace('"AMOUNT"', literal).encode()


def test_every_line_of_a_hostile_file_ends_valid_or_rejected_with_a_reason(sim, tmp_path: Path) -> None:
    tx = next(sim.transaction_records())
    open_tx = json.dumps(tx)[:-1]  # the transaction's fields with the object left open
    malformed, not_object = RejectReason.MALFORMED_JSON, RejectReason.NOT_AN_OBJECT
    hostile = [
        (b"[" * 10_000 + b"]" * 10_000, malformed),  # nested past the recursion limit
        (f'{open_tx}, "extra": {"{" * 10_000}{"}" * 10_000}}}'.encode(), malformed),  # same, inside an event
        (b"\xc3\x28\xa0\xa1 not UTF-8", malformed),
        (b"\x00", malformed),
        (b"42", not_object),
        (b'"a string"', not_object),
        (b"null", not_object),
        (b"[" + json.dumps(tx).encode() + b"]", not_object),
        (_with_amount(tx, "9" * 5000), malformed),  # past Python's int-from-text digit limit
        (_with_amount(tx, "9" * 400), RejectReason.NON_FINITE_AMOUNT),  # parses, but no float holds it
        (_with_amount(tx, "1e999"), RejectReason.NON_FINITE_AMOUNT),
        (_with_amount(tx, "NaN"), RejectReason.NON_FINITE_AMOUNT),
        (f'{open_tx}, "extra": {"7" * 5000}}}'.encode(), malformed),
        (f'{open_tx}, "score": NaN}}'.encode(), malformed),  # json.loads takes it; JSON and the wire do not
        (f'{open_tx}, "score": -Infinity}}'.encode(), malformed),
        (f'{open_tx}, "note": "\\ud800"}}'.encode(), malformed),  # a lone surrogate has no UTF-8 form
        (json.dumps({**tx, "card_id": "\ud800"}).encode(), malformed),
    ]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join([json.dumps(tx).encode(), *(line for line, _ in hostile), json.dumps(tx).encode()]))

    scan = scan_events(read_event_lines(path))

    last = len(hostile) + 2
    assert [e.line_no for e in scan.valid] == [1, last]
    assert {r.line_no: r.rejection.reason for r in scan.rejected} == {
        line_no: reason for line_no, (_, reason) in enumerate(hostile, start=2)}
    assert all(r.rejection.detail for r in scan.rejected)
    rejects = tmp_path / "rejects.jsonl"
    assert write_rejects(scan.rejected, rejects) == len(hostile)
    assert [json.loads(line)["line"] for line in rejects.read_text(encoding="utf-8").splitlines()] == list(
        range(2, last))


def test_unreadable_files_raise_a_named_error(tmp_path: Path) -> None:
    with pytest.raises(EventFileError, match="no such file"):
        list(read_event_lines(tmp_path / "missing.jsonl"))
    odd = tmp_path / "events.csv"
    odd.write_text("a,b\n")
    with pytest.raises(EventFileError, match="extension"):
        list(read_event_lines(odd))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really")
    with pytest.raises(EventFileError, match="Parquet"):
        list(read_event_lines(broken))


def test_a_parquet_file_corrupt_past_its_first_row_group_raises_a_named_error(tmp_path: Path) -> None:
    rows = 200_000
    table = pa.table({"schema_version": [1] * rows, "card_id": [f"card-{i}" for i in range(rows)]})
    path = tmp_path / "events.parquet"
    pq.write_table(table, path, row_group_size=50_000)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # footer intact, so the file opens; a later row group is garbage
    data[middle:middle + 2000] = b"\xab" * 2000
    path.write_bytes(bytes(data))
    with pytest.raises(EventFileError, match="unreadable Parquet data after row"):
        list(read_event_lines(path))
