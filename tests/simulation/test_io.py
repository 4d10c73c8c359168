"""Event files: simulated data round-trips through JSONL and Parquet; bad lines are named by line."""

from __future__ import annotations

import json
from pathlib import Path

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
        4: (RejectReason.NON_POSITIVE_AMOUNT, "amount"),
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
