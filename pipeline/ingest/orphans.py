"""Orphan labels: kept labels whose transaction the raw store does not hold.

A fraud report can reach the store before its payment does: the payment is still in flight, was
quarantined (and may be re-sent), or lies in a window not ingested yet. Such a label lands like
any other, since its transaction may still come and the dataset joins labels to transactions
only when it is built. Nothing is dropped; each run counts them so that the operator sees them
(``orphan_labels`` in :class:`pipeline.ingest.accounting.TopicAccounting`).

A label is an orphan of a run when its ``transaction_id`` is neither among the committed raw
transactions nor among this run's landed ones (duplicates already removed). Runs on the driver
with Arrow, like :mod:`pipeline.ingest.duplicates`: a streaming scan of the stored
``transaction_id`` column, filtered on the ids this run's labels name.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

LINK = "transaction_id"  # a label's transaction_id names the transaction it reports on


def orphan_mask(label_ids: pa.Array, known_ids: pa.Array) -> pa.Array:
    """True where a label's transaction id is not among ``known_ids`` (pure)."""
    return pc.invert(pc.is_in(label_ids, value_set=known_ids))


def known_transactions(transaction_files: list[Path], wanted: pa.Array) -> pa.Array:
    """Distinct ids among ``wanted`` that raw transaction files hold (streaming, filtered scan)."""
    if not transaction_files or len(wanted) == 0:
        return pa.array([], pa.string())
    scanned = ds.dataset([str(f) for f in transaction_files], format="parquet").to_table(
        columns=[LINK], filter=pc.field(LINK).isin(wanted))
    return pc.unique(scanned[LINK].combine_chunks())


def count_orphan_labels(label_files: list[Path], transaction_files: list[Path]) -> int:
    """How many rows of the raw label files name a transaction no raw transaction file holds."""
    if not label_files:
        return 0
    ids = ds.dataset([str(f) for f in label_files], format="parquet").to_table(columns=[LINK])[LINK].combine_chunks()
    return orphan_mask(ids, known_transactions(transaction_files, pc.unique(ids))).true_count
