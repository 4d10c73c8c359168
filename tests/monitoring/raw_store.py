"""The raw store's payments and fraud reports for the monitoring tests: written in the raw store's
own layout and committed, without Spark."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract import Kind
from pipeline.ingest.offsets import OffsetStore
from pipeline.ingest.raw_layout import DATE_COLUMN_BY_KIND, TABLE_BY_KIND, raw_arrow_schema


def write_raw_store(root: Path, payments: pd.DataFrame, reports: list[tuple[str, bool, datetime]],
                    run_id: str = "run-1") -> None:
    """Committed raw-store files: ``payments`` (transaction_id, card_id, event_time) by event date,
    ``reports`` (transaction_id, is_fraud, reported_at) by report date."""
    tx = payments.assign(event_time=pd.to_datetime(payments["event_time"], utc=True))
    labels = pd.DataFrame(reports, columns=["transaction_id", "is_fraud", "reported_at"])
    labels["reported_at"] = pd.to_datetime(labels["reported_at"], utc=True)
    for kind, frame, column in ((Kind.TRANSACTION, tx, "event_time"), (Kind.LABEL, labels, "reported_at")):
        for day, rows in frame.groupby(frame[column].dt.date):
            path = (root / TABLE_BY_KIND[kind] / f"{DATE_COLUMN_BY_KIND[kind]}={day}" / f"run_id={run_id}"
                    / "part-00000.parquet")
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(_raw_table(kind, rows), path)
    OffsetStore(root).commit(run_id, [])


def _raw_table(kind: Kind, rows: pd.DataFrame) -> pa.Table:
    schema = raw_arrow_schema(kind)
    columns = []
    for f in schema:
        if f.name in rows:
            values = rows[f.name]
            if pa.types.is_timestamp(f.type):
                values = values.dt.tz_convert(None).to_numpy()
            columns.append(pa.array(values.to_numpy() if hasattr(values, "to_numpy") else values, type=f.type))
        else:
            columns.append(pa.nulls(len(rows), type=f.type))
    return pa.Table.from_arrays(columns, schema=schema)
