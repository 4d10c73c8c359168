"""Commit already-valid events to the raw store as one run, without Kafka or Spark.

What the feature benchmark and the feature-table tests use to lay down weeks of history in
seconds: the same files, identity index and commit a real ingest run leaves (raw layout of
:mod:`pipeline.ingest.raw_layout`, index segments of :mod:`pipeline.ingest.id_index`, then the
commit), minus the Kafka positions (null) and the validation (the caller's events are the
simulator's, valid by construction). Not for production data: nothing here checks the contract,
duplicates or timing.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract import TIME_FIELD_BY_KIND, Kind
from pipeline.ingest.id_index import EPOCH, Entries
from pipeline.ingest.identity import content_hashes, identity_hashes
from pipeline.ingest.index_build import build_missing_index
from pipeline.ingest.raw_layout import (
    DATE_COLUMN_BY_KIND,
    RUN_ID,
    TABLE_BY_KIND,
    RawStore,
    raw_arrow_schema,
    write_table_atomic,
)


def raw_table(kind: Kind, events: pd.DataFrame) -> pa.Table:
    """Events with contract columns (times as RFC 3339 strings or timestamps) as a raw file's table:
    contract fields typed, Kafka columns and payload null."""
    columns = []
    for field in raw_arrow_schema(kind):
        if field.name not in events:
            columns.append(pa.nulls(len(events), field.type))
        elif pa.types.is_timestamp(field.type):
            stamps = pd.to_datetime(events[field.name], utc=True, format="ISO8601").dt.as_unit("us")
            columns.append(pa.array(stamps.astype("int64").to_numpy(), pa.int64()).cast(field.type))
        else:
            columns.append(pa.array(events[field.name].to_numpy(), field.type, from_pandas=True))
    return pa.Table.from_arrays(columns, schema=raw_arrow_schema(kind))


def _by_date(kind: Kind, table: pa.Table) -> dict[int, pa.Table]:
    days = np.floor_divide(pc.cast(table.column(TIME_FIELD_BY_KIND[kind]), pa.int64()).to_numpy(), 86_400_000_000)
    return {int(d): table.filter(pa.array(days == d)) for d in np.unique(days)}


def commit_raw_run(store: RawStore, run_id: str, transactions: pd.DataFrame, labels: pd.DataFrame) -> None:
    """Write ``transactions`` and ``labels`` as run ``run_id`` (one file per date), add the run to
    the identity index and commit it. Call with the store's lock held."""
    build_missing_index(store)  # a store committed before the index existed: index its runs first
    committed = store.committed()
    ordinal = len(committed.runs)
    index = dict(committed.index or {})
    for kind, events in ((Kind.TRANSACTION, transactions), (Kind.LABEL, labels)):
        parts = []
        for day, rows in _by_date(kind, raw_table(kind, events)).items():
            iso = (EPOCH + timedelta(days=day)).isoformat()
            path = store.table_path(kind) / f"{DATE_COLUMN_BY_KIND[kind]}={iso}" / f"{RUN_ID}={run_id}" / "part-00000.parquet"
            write_table_atomic(rows, path)
            n = rows.num_rows
            parts.append(Entries(identity_hashes(rows, kind), content_hashes(rows, kind),
                                 np.full(n, day, np.int32), np.full(n, ordinal, np.int32)))
        index[TABLE_BY_KIND[kind]] = store.id_index(kind).with_run(ordinal, Entries.concat(parts))
    store.offsets.commit(run_id, [], index=index)
