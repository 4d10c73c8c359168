"""The raw store's Arrow reader: exactly the committed rows, with the date and run their paths name."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract import Kind
from pipeline.ingest.offsets import OffsetStore
from pipeline.ingest.raw_layout import DATE_COLUMN_BY_KIND, TABLE_BY_KIND, RawStore, raw_arrow_schema
from pipeline.ingest.raw_reader import committed_files_by_date, read_files, read_raw

D1, D2, D3 = date(2026, 3, 1), date(2026, 3, 2), date(2026, 3, 3)


def write_file(root: Path, kind: Kind, day: date, run: str, ids: list[str], name: str = "part-00000.parquet") -> Path:
    """A raw file of ``kind`` in the store's layout holding transactions ``ids`` (other columns null)."""
    schema = raw_arrow_schema(kind)
    time = datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
    values = {"transaction_id": pa.array(ids), "event_time": pa.array([time] * len(ids), schema.field("event_time").type)}
    table = pa.Table.from_arrays([values.get(f.name, pa.nulls(len(ids), f.type)) for f in schema], schema=schema)
    path = root / TABLE_BY_KIND[kind] / f"{DATE_COLUMN_BY_KIND[kind]}={day}" / f"run_id={run}" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def store_with_an_uncommitted_run(root: Path) -> RawStore:
    """Runs r1 (D1, D2) and r2 (D2) committed; r3 (killed: D2, beside r1's and r2's files, and D3) not."""
    write_file(root, Kind.TRANSACTION, D1, "r1", ["a", "b"])
    write_file(root, Kind.TRANSACTION, D2, "r1", ["c"])
    write_file(root, Kind.TRANSACTION, D2, "r2", ["d", "e"])
    write_file(root, Kind.TRANSACTION, D2, "r3", ["killed-1"])
    write_file(root, Kind.TRANSACTION, D3, "r3", ["killed-2"])
    OffsetStore(root).commit("r1", [])
    OffsetStore(root).commit("r2", [])
    return RawStore(root)


def rows(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table[c].to_pylist() for c in table.column_names), strict=True))


def test_reads_exactly_the_committed_rows_with_their_date_and_run(tmp_path):
    store = store_with_an_uncommitted_run(tmp_path / "raw")
    table = read_raw(store, Kind.TRANSACTION, ["transaction_id", "event_date", "run_id"])
    assert rows(table) == [("a", D1, "r1"), ("b", D1, "r1"), ("c", D2, "r1"), ("d", D2, "r2"), ("e", D2, "r2")]
    assert table.schema.field("event_date").type == pa.date32()
    assert rows(read_raw(store, Kind.TRANSACTION, ["transaction_id"], since=D2, until=D2)) == [("c",), ("d",), ("e",)]
    assert rows(read_raw(store, Kind.TRANSACTION, ["transaction_id"], since=D3)) == []
    assert store.latest_date(Kind.TRANSACTION) == D2  # r3's later date is not the store's


def test_the_listing_gives_each_committed_file_its_partition(tmp_path):
    store = store_with_an_uncommitted_run(tmp_path / "raw")
    files = store.committed_raw_files(Kind.TRANSACTION)
    assert [(f.day, f.run_id) for f in files] == [(D1, "r1"), (D2, "r1"), (D2, "r2")]
    by_date = committed_files_by_date(store, Kind.TRANSACTION)
    assert {d: [p.parent.name for p in paths] for d, paths in by_date.items()} == {D1: ["run_id=r1"],
                                                                                 D2: ["run_id=r1", "run_id=r2"]}
    assert store.committed_rows_by_date(Kind.TRANSACTION, D1, D3) == {D1: 2, D2: 3}
    assert read_files(by_date[D2], Kind.TRANSACTION, ["transaction_id"])["transaction_id"].to_pylist() == ["c", "d", "e"]


def test_an_empty_read_is_typed(tmp_path):
    store = RawStore(tmp_path / "raw")
    table = read_raw(store, Kind.LABEL, ["transaction_id", "reported_at", "report_date"])
    assert table.num_rows == 0
    assert table.schema == pa.schema([("transaction_id", pa.string()), ("reported_at", pa.timestamp("us", tz="UTC")),
                                      ("report_date", pa.date32())])
    assert read_files([], Kind.LABEL, ["is_fraud"]).schema == pa.schema([("is_fraud", pa.bool_())])
