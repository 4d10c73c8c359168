"""Build the identity index (:mod:`pipeline.ingest.id_index`) of a store committed before it
existed, from its committed raw files: one segment holding every committed row.

Runs once, under the store's lock, before the first run that needs the index. It reads each
committed file's typed columns once (O(history), the one time), and records the index in the
commit log without committing a run (:meth:`pipeline.ingest.offsets.OffsetStore.set_index`). A
kill before that leaves an unlisted segment, which the next run deletes and builds again.
"""

from __future__ import annotations

import numpy as np

from pipeline.contract import FIELDS_BY_KIND, Kind
from pipeline.ingest.id_index import EPOCH, Entries, segment_name
from pipeline.ingest.identity import content_hashes, identity_hashes
from pipeline.ingest.raw_layout import TABLE_BY_KIND, RawStore
from pipeline.ingest.raw_reader import read_files


def committed_entries(store: RawStore, kind: Kind) -> Entries:
    """Index entries of every committed raw row of ``kind`` (date and run from each file's path)."""
    ordinal = {run: i for i, run in enumerate(store.committed().runs)}
    fields = [s.name for s in FIELDS_BY_KIND[kind]]
    parts = []
    for file in store.committed_raw_files(kind):
        table = read_files([file.path], kind, fields)
        day = (file.day - EPOCH).days
        run = ordinal[file.run_id]
        n = table.num_rows
        parts.append(Entries(identity_hashes(table, kind), content_hashes(table, kind),
                             np.full(n, day, np.int32), np.full(n, run, np.int32)))
    return Entries.concat(parts)


def build_missing_index(store: RawStore) -> dict[str, list[str]] | None:
    """Build and record the index when the commit log has runs but no index; returns the index
    recorded, or None when there was nothing to do. Call with the lock held."""
    committed = store.committed()
    if committed.index is not None or not committed.runs:
        return None
    last = len(committed.runs) - 1
    index = {}
    for kind, table in TABLE_BY_KIND.items():
        entries = committed_entries(store, kind)
        index[table] = store.id_index(kind, []).with_segment(segment_name(0, last), entries) if len(entries) else []
    store.offsets.set_index(index)
    return index
