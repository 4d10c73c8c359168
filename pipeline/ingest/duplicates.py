"""``DUPLICATE``: one copy of each event identity enters the raw store.

Identity of a transaction: its ``transaction_id``. Of a label: ``(transaction_id, is_fraud,
reported_at)``, since several reports for one transaction are legitimate (a fraud report, then a
clearing review). First arrival wins: a record whose identity the raw store already holds is a
duplicate; within one run the copy with the smallest ``(Kafka timestamp, topic, partition,
offset)`` is kept (a missing timestamp sorts last) and every other copy is a duplicate.

Runs on the driver with Arrow (C++ hash aggregation and a streaming, filtered scan of the stored
identity columns): after landing, only identity and position columns are read, which is far
cheaper here than Spark's shuffle stages. A store too large for one scan per run would keep a
bucketed identity index instead.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.contract import Kind

IDENTITY_BY_KIND: dict[Kind, tuple[str, ...]] = {
    Kind.TRANSACTION: ("transaction_id",),
    Kind.LABEL: ("transaction_id", "is_fraud", "reported_at"),
}
POSITION = ("topic", "partition", "offset")
ARRIVAL = "kafka_timestamp"


def read_new_rows(files: list[Path], kind: Kind) -> pa.Table:
    """Identity, arrival time and position of this run's landed rows."""
    columns = [*IDENTITY_BY_KIND[kind], ARRIVAL, *POSITION]
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=columns) if files else None


def stored_matches(files: list[Path], kind: Kind, new_rows: pa.Table) -> pa.Table:
    """Distinct stored identities that also occur in ``new_rows`` (streaming scan, filtered on the
    first identity column)."""
    keys = list(IDENTITY_BY_KIND[kind])
    if not files:
        return new_rows.select(keys).slice(0, 0)
    wanted = pc.unique(new_rows[keys[0]])
    scanned = ds.dataset([str(f) for f in files], format="parquet").to_table(
        columns=keys, filter=pc.field(keys[0]).isin(wanted))
    return scanned.group_by(keys).aggregate([])


def find_duplicates(new_rows: pa.Table, stored: pa.Table, kind: Kind) -> set[tuple[str, int, int]]:
    """Positions of the rows of ``new_rows`` that are duplicates (pure)."""
    keys = list(IDENTITY_BY_KIND[kind])
    counts = new_rows.group_by(keys).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1)).select(keys)
    flagged = pa.concat_tables([repeated, stored.select(keys).cast(repeated.schema)]).group_by(keys).aggregate([])
    if flagged.num_rows == 0:
        return set()
    in_store = {tuple(r.values()) for r in stored.select(keys).to_pylist()}
    candidates = new_rows.join(flagged, keys, join_type="inner")
    arrival = pc.fill_null(pc.cast(candidates[ARRIVAL], pa.int64()), 2**62)  # no timestamp: sorts last
    candidates = candidates.append_column("_arrival", arrival).sort_by(
        [(k, "ascending") for k in keys] + [("_arrival", "ascending"), *((c, "ascending") for c in POSITION)])
    duplicates, seen = set(), set()
    for row in candidates.to_pylist():  # only identities that occur twice: few rows
        identity = tuple(row[k] for k in keys)
        if identity in in_store or identity in seen:
            duplicates.add(tuple(row[c] for c in POSITION))
        seen.add(identity)
    return duplicates
